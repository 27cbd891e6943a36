"""Dedicated sessions: connecting, running statements under the store deadline,
and queueing a follower's session for the election's lock (the lock part)."""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysql.constants import CLIENT, ER

from ...exceptions import StoreMisconfigured, StoreUnavailable
from .. import StoreParams
from ..errors import first_line
from ..session_lock import SessionGone, SessionStore
from ..waiting import LockWaiter
from .entries import ADD_CHANGES, CHANGES_READY
from .params import connection_params
from .sql import (
    CREATE_SCHEMA,
    SCHEMA_EXISTS,
    SETUP,
    WAIT_LOCK,
    statement_deadline,
    whole_seconds,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """One statement's result: its rows (empty for a write) and the rows it matched."""

    rows: tuple[tuple[Any, ...], ...]
    rowcount: int


class Session:
    """A dedicated connection and the server thread (``CONNECTION_ID()``) behind it."""

    def __init__(self, conn: pymysql.Connection[Any], conn_id: int) -> None:
        self.conn = conn
        self.conn_id = conn_id
        #: One statement at a time, and ``close()`` never races a statement
        #: (PyMySQL connections are not thread-safe).
        self.lock = threading.Lock()
        #: The server's ``VERSION()``: how it spells a statement deadline.
        self.version = ""

    def read_timeout(self, seconds: float) -> None:
        """Give every answer on this session up to ``seconds`` from now on.

        PyMySQL has no setter, but reads ``_read_timeout`` back at every read."""
        self.conn._read_timeout = seconds  # type: ignore[attr-defined]

    def cut(self) -> None:
        """Cut the connection under a statement another thread waits on.

        ``close()`` cannot: it waits for the statement (:attr:`lock`), and PyMySQL has no
        other way in but its socket. The server then drops the session from lock queues."""
        sock = self.conn._sock  # type: ignore[attr-defined]
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already

    def close(self) -> None:
        with self.lock:
            try:
                self.conn.close()
            except pymysql.MySQLError:
                pass  # already broken: closing the socket is all there was to do


class Connector(SessionStore[Session]):
    """The store's connection object, shared by its facets: sessions and statements.

    PyMySQL's read and write timeouts (the store deadline) close a connection that
    does not answer; the server cancels a slow statement a little before, so that a
    merely slow server costs one failed call, not the session and its term."""

    schema = ((SCHEMA_EXISTS, CREATE_SCHEMA), (CHANGES_READY, ADD_CHANGES))

    def __init__(self, store: StoreParams) -> None:
        params, target = connection_params(store.url, store.connection)
        password = str(params.get("password") or "")
        super().__init__(store, target, password)
        self.params = params

    @property
    def database(self) -> str:
        """The database every session uses (named locks include it)."""
        return str(self.params["database"])

    def connect(self, ttl: float | None) -> Session:
        """A new dedicated session; ``ttl`` set means it may hold a lock, and runs
        with ``wait_timeout`` = the ttl rounded up to whole seconds."""
        try:
            conn = pymysql.connect(
                **self.params,
                autocommit=True,
                client_flag=CLIENT.MULTI_STATEMENTS | CLIENT.FOUND_ROWS,
                charset="utf8mb4",
                program_name="celery-leader",
                connect_timeout=max(2.0, self.timeout),
                read_timeout=self.timeout,
                write_timeout=self.timeout,
            )
        except pymysql.MySQLError as exc:
            raise StoreUnavailable(
                f"cannot connect to {self.target}: {self.describe(exc)}"
            ) from exc
        session = Session(conn, 0)
        try:
            # Admin sessions keep the server's wait_timeout: they live for one statement.
            idle_s = whole_seconds(ttl) if ttl is not None else None
            _, ident, variables = self.results(
                session, SETUP, {"idle_s": idle_s, "lock_wait_s": whole_seconds(self.timeout)}
            )
            session.conn_id, version = ident.rows[0]
            session.version = str(version)
            self._refuse_clusters(dict(variables.rows))
            self.deadline(session)
        except Exception:
            session.close()
            raise
        return session

    def deadline(self, session: Session, wait: float = 0.0) -> None:
        """Give each statement on ``session`` the store deadline, or, with ``wait``,
        a lock wait of up to ``wait`` seconds and the store deadline after it.

        The server cancels a statement at 90 % of the deadline, so the session survives;
        a lock wait may outlast the deadline, so the server's limit is lifted for it."""
        limit = None if wait else self.timeout * 0.9
        self.execute(session, *statement_deadline(session.version, limit))
        session.read_timeout(self.timeout + wait)

    def execute(
        self, session: Session, query: str, params: Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        return list(self.results(session, query, params)[-1].rows)

    def results(
        self, session: Session, query: str, params: Mapping[str, Any] | None = None
    ) -> list[Result]:
        """Run ``query`` (one or more statements, one round trip) under the store
        deadline; one :class:`Result` per statement. PyMySQL errors become
        StoreUnavailable (SessionGone when the connection is closed)."""
        with session.lock:
            try:
                with session.conn.cursor() as cursor:
                    cursor.execute(query, params)
                    results = [Result(tuple(cursor.fetchall()), cursor.rowcount)]
                    while cursor.nextset():
                        results.append(Result(tuple(cursor.fetchall()), cursor.rowcount))
                    return results
            except pymysql.MySQLError as exc:
                if _code(exc) == ER.NO_SUCH_TABLE:
                    self._schema_ready = False  # dropped behind our back: make it again
                message = f"{self.target}: {self.describe(exc)}"
                if not session.conn.open:
                    raise SessionGone(message) from exc
                raise StoreUnavailable(message) from exc

    def check_session(self, session: Session, server_id: int) -> None:
        """Refuse a proxy that runs our statements on more than one server connection."""
        if server_id != session.conn_id:
            raise StoreMisconfigured(
                f"leader_url {self.target}: statements on one connection ran on two server "
                "connections; a proxy that multiplexes connections (ProxySQL?) is in the way. "
                "celery-leader holds a session lock: connect to the server directly"
            )

    def describe(self, exc: BaseException) -> str:
        """One line from a PyMySQL error, without its tuple form or any password."""
        args = exc.args
        # PyMySQL's errors are (code, message); others are one message.
        text = " ".join(str(args[1]).split()) if len(args) >= 2 else first_line(exc)
        text = text or type(exc).__name__
        text = re.sub(r"\s*\(timed out\)$", " (no answer within the store deadline)", text)
        return self.masked(text)

    def _refuse_clusters(self, variables: Mapping[str, str]) -> None:
        """Refuse Galera and group replication: named locks are not replicated there."""
        if str(variables.get("wsrep_on", "OFF")).upper() == "ON":
            cluster = "a Galera cluster (wsrep_on)"
        elif variables.get("group_replication_group_name"):
            cluster = "a group replication member"
        else:
            return
        raise StoreMisconfigured(
            f"leader_url {self.target} is {cluster}: GET_LOCK locks are not replicated, so "
            "two nodes would each grant an election; point leader_url at one server "
            "(a primary with asynchronous or semi-synchronous replicas)"
        )

    def queue(self, session: Session, params: Mapping[str, Any], ttl: float) -> LockWaiter[Session]:
        """Queue ``session`` for the named lock ``params`` name, in a thread of its own.

        One ``GET_LOCK`` a ttl (slices of half the deadline made a fleet's followers send
        most of the server's statements); each answer must come within the slice and the
        deadline. A follower that leaves cuts its connection (:meth:`Session.cut`)."""
        lock = params["lock"]
        slice_s = round(ttl, 3)

        def wait(session: Session, cancelled: threading.Event) -> bool:
            try:
                self.deadline(session, wait=slice_s)
                while not cancelled.is_set():
                    result = self.execute(session, WAIT_LOCK, {"lock": lock, "slice_s": slice_s})
                    if result[0][0] == 1:
                        self.deadline(session)  # it holds the lock now: a renewal's deadline
                        return True
            except StoreUnavailable as exc:
                # The follower's next acquire connects afresh and reports errors itself.
                logger.debug("celery-leader: lock waiter stopped: %s", exc)
            return False

        return LockWaiter(
            session, wait, Session.close, name="celery-leader-mysql-waiter", interrupt=Session.cut
        )


def _code(exc: BaseException) -> int | None:
    args = exc.args
    return args[0] if args and isinstance(args[0], int) else None
