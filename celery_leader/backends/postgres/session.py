"""Dedicated sessions: connecting, running one statement under the store deadline,
and queueing a follower's session for the election's lock."""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import errors
from psycopg.rows import TupleRow

from ...exceptions import StoreMisconfigured, StoreUnavailable
from .. import StoreParams
from ..errors import first_line
from ..session_lock import SessionGone, SessionStore
from ..waiting import LockWaiter
from .entries import ADD_CHANGES, CHANGES_READY
from .params import connection_params
from .sql import (
    ADD_CLAIM,
    CLAIM_READY,
    CLIENT_CHECK_MS,
    CREATE_SCHEMA,
    MIN_SERVER_VERSION,
    SCHEMA_EXISTS,
    SETUP,
    WAIT_DONE,
    WAIT_LOCK,
    WAIT_SETUP,
    ms,
)

logger = logging.getLogger(__name__)


class Session:
    """A dedicated connection and the server process (pid) behind it."""

    def __init__(self, conn: psycopg.Connection[TupleRow], pid: int) -> None:
        self.conn = conn
        self.pid = pid
        #: One statement at a time, and ``close()`` never races a statement
        #: (psycopg's ``close`` does not wait for one running in another thread).
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            self.conn.close()


class _Watchdog:
    """Cuts a connection off when a statement outlives the store deadline.

    psycopg has no client-side statement timeout, and ``statement_timeout`` cannot
    help when the server or the network hangs; the session is lost with it."""

    def __init__(self, conn: psycopg.Connection[TupleRow], timeout: float) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._armed = True
        self._fired = False
        self._timer = threading.Timer(timeout, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        # Under the lock, so the statement cannot finish and its connection
        # close (freeing the descriptor number for reuse) while we shut it down.
        with self._lock:
            if not self._armed:
                return
            self._fired = True
            try:
                with socket.socket(fileno=os.dup(self._conn.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except (OSError, psycopg.Error):
                pass  # the connection is closed already: the call fails by itself

    def stop(self) -> bool:
        """Disarm; True when the deadline had passed and the socket was cut."""
        with self._lock:
            self._armed = False
        self._timer.cancel()
        return self._fired


class Canceller:
    """Cancels the statement running on ``session`` once ``delay`` has passed: a
    commit's wait for the synchronous standbys, which ``statement_timeout`` does not
    cover (the commit then stands on the primary alone, and the caller undoes it)."""

    def __init__(self, session: Session, delay: float, timeout: float) -> None:
        self._session = session
        self._timeout = timeout
        self.fired = False
        self._timer = threading.Timer(delay, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        try:
            self._session.conn.cancel_safe(timeout=self._timeout)
        except psycopg.Error:
            pass  # unreachable server: the store deadline cuts the session

    def stop(self) -> bool:
        """Disarm, and wait for a cancel under way; True when it fired."""
        self._timer.cancel()
        if self._timer.is_alive():
            self._timer.join()
        return self.fired


class Connector(SessionStore[Session]):
    """The store's connection object, shared by its facets: sessions and statements.

    The server cancels a statement a little before the store deadline
    (``statement_timeout``); the client cuts the connection at it all the same."""

    schema = (
        (SCHEMA_EXISTS, CREATE_SCHEMA),
        (CHANGES_READY, ADD_CHANGES),
        (CLAIM_READY, ADD_CLAIM),
    )

    def __init__(self, store: StoreParams) -> None:
        params, target = connection_params(store.url, store.timeout, store.connection)
        password = str(params.get("password") or "")
        super().__init__(store, target, password)
        self.params = params
        # The server cancels a slow statement a little before our own deadline
        # cuts the connection: a merely slow server then costs one failed call,
        # not the session and the term held in it.
        self.statement_ms = ms(store.timeout * 0.9)

    def connect(self, ttl: float | None) -> Session:
        """A new dedicated session; ``ttl`` set means it may hold a lock."""
        try:
            conn = psycopg.connect(**self.params, autocommit=True)
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot connect to {self.target}: {self.describe(exc)}"
            ) from exc
        try:
            self._require_server_version(conn.info.server_version)
            session = Session(conn, 0)
            idle_ms = "0" if ttl is None else ms(ttl)
            rows = self.execute(
                session, SETUP, {"statement_ms": self.statement_ms, "idle_ms": idle_ms}
            )
            session.pid = rows[0][0]
        except Exception:
            conn.close()
            raise
        return session

    def execute(
        self, session: Session, query: str, params: Mapping[str, Any] | None = None
    ) -> list[TupleRow]:
        with session.lock:
            watchdog = _Watchdog(session.conn, self.timeout)
            try:
                cursor = session.conn.execute(query, params)
                return cursor.fetchall() if cursor.description is not None else []
            except psycopg.Error as exc:
                cut = watchdog.stop()
                if isinstance(exc, (errors.UndefinedTable, errors.UndefinedFunction)):
                    self._schema_ready = False  # dropped behind our back: make it again
                if cut:
                    raise SessionGone(
                        f"{self.target}: no answer within {self.timeout:g} s"
                    ) from exc
                message = f"{self.target}: {self.describe(exc)}"
                if session.conn.closed:
                    raise SessionGone(message) from exc
                raise StoreUnavailable(message) from exc
            finally:
                watchdog.stop()

    def check_session(self, session: Session, server_id: int) -> None:
        """Refuse a pooler that runs our statements in more than one server session."""
        if server_id != session.pid:
            raise StoreMisconfigured(
                f"leader_url {self.target}: statements on one connection ran in two server "
                "sessions; a connection pooler in transaction or statement mode (PgBouncer "
                "pool_mode=transaction?) is in the way. celery-leader holds a session lock: "
                "connect to PostgreSQL directly or through session pooling"
            )

    def describe(self, exc: BaseException) -> str:
        """One line from a psycopg error, without libpq's noise or any password."""
        text = first_line(exc) or type(exc).__name__
        text = re.sub(r"^connection failed: ", "", text)
        text = re.sub(r'^connection to server (?:at|on) "[^"]*".*? failed: ', "", text)
        text = re.sub(r"^FATAL:\s+", "", text)
        return self.masked(text)

    def _require_server_version(self, version: int) -> None:
        """Refuse a server without ``idle_session_timeout`` (before 14)."""
        if version < MIN_SERVER_VERSION:
            major = version // 10000 if version >= 100000 else version / 10000
            raise StoreMisconfigured(
                f"leader_url {self.target}: PostgreSQL {major:g} has no idle_session_timeout, "
                "which ends a paused or cut-off leader's session on time; celery-leader needs "
                "PostgreSQL 14 or later"
            )

    def queue(self, session: Session, params: Mapping[str, Any], ttl: float) -> LockWaiter[Session]:
        """Queue ``session`` for the advisory lock ``params`` name, in a thread of its own."""
        key = params["key"]

        def wait(session: Session, cancelled: threading.Event) -> bool:
            try:
                with session.lock:
                    conn = session.conn
                    conn.execute(WAIT_SETUP, {"slice_ms": ms(ttl), "check_ms": CLIENT_CHECK_MS})
                    while not cancelled.is_set():
                        try:
                            conn.execute(WAIT_LOCK, {"key": key})
                        except errors.LockNotAvailable:
                            continue  # end of a slice: queue again with a fresh snapshot
                        conn.execute(WAIT_DONE, {"statement_ms": self.statement_ms})
                        return True
            except psycopg.Error as exc:
                # The follower's next acquire connects afresh and reports errors itself.
                logger.debug("celery-leader: lock waiter stopped: %s", exc)
            return False

        def interrupt(session: Session) -> None:
            try:
                session.conn.cancel_safe(timeout=self.timeout)
            except psycopg.Error:
                pass  # unreachable server: keepalives end the wait

        return LockWaiter(
            session, wait, Session.close, name="celery-leader-pg-waiter", interrupt=interrupt
        )
