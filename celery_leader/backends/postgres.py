"""PostgreSQL store: ``postgresql://``, ``postgres://`` and ``django://<alias>``.

A term is a *session-level advisory lock* held on a dedicated connection (never
one from a pool), in autocommit mode. The lock of election ``e`` under key
prefix ``p`` has the ``bigint`` key :func:`advisory_key`: the first 8 bytes of
SHA-256 of ``"p:e"``, read as a big-endian signed integer. In ``pg_locks`` it
shows as ``locktype = 'advisory'``, ``classid`` = the high 32 bits,
``objid`` = the low 32 bits (both unsigned) and ``objsubid = 1``. Advisory
locks are per database: every instance must connect to the same one.

The server frees the lock when the session ends, so:

* a holder whose process dies (its socket closes) is replaced at once: every
  follower is queued for the lock in a blocking ``pg_advisory_lock`` on its
  own session, and PostgreSQL grants it to one of them the moment the lock is
  free;
* a holder that is paused or cut off loses it on time, because its session
  runs with ``idle_session_timeout`` = the ttl (PostgreSQL >= 14): the server
  ends a session that sent nothing for a ttl, and renewals are statements on
  that session, which restart the count. No hold-off is needed (see
  :attr:`PostgresBackend.holdoff`).

A session can also end early: a server restart or fail-over,
``pg_terminate_backend``, a missed store deadline (the backend then cuts the
connection itself). The old holder learns it at its next renewal (at most one
renew interval later), and its claims fail at once because they run on the
dead session.

Two tables (created on first use, shared by every key prefix):

* ``celery_leader_lease`` - one row per election: the epoch (bumped in the
  lock's own session on every acquisition), the current term's token JSON,
  instance id and server pid, and the token an operator asked to resign;
* ``celery_leader_state`` - shared schedule state: election, entry, JSON value.

Connection poolers in transaction or statement mode (PgBouncer with
``pool_mode = transaction``, a common production setting) break all of this: a
session lock needs the same server session for every statement. The backend
compares the server pid of every acquire and renew statement with its
session's and refuses to go on (ConfigError) when it changes; claims check
``pg_locks`` for their own session, so they fail rather than write unfenced.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from .._urls import mask_url
from ..exceptions import ConfigError, StoreUnavailable
from .base import Acquired, Backend, Claim, HolderInfo, Renewal, Tenure

logger = logging.getLogger(__name__)

#: ``idle_session_timeout`` appeared in PostgreSQL 14.
MIN_SERVER_VERSION = 140000

#: How often a queued follower's server process checks that its client is
#: still there (``client_connection_check_interval``), so that a dead
#: follower leaves the lock queue instead of being granted the lock first.
_CLIENT_CHECK_MS = "1000"

#: How often :meth:`PostgresBackend.wait` looks at its ``cancel`` event.
_CANCEL_POLL = 0.05

#: Django ``OPTIONS`` keys that are Django's or psycopg's own, not libpq's.
_DJANGO_ONLY_OPTIONS = frozenset(
    {
        "assume_role",
        "context",
        "cursor_factory",
        "isolation_level",
        "pool",
        "prepare_threshold",
        "server_side_binding",
    }
)


def advisory_key(key_prefix: str, election: str) -> int:
    """The advisory-lock key of ``election``: SHA-256 of ``"<prefix>:<election>"``,
    first 8 bytes, big-endian, signed (PostgreSQL's ``bigint``)."""
    digest = hashlib.sha256(f"{key_prefix}:{election}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _lock_ids(key: int) -> dict[str, int]:
    """``pg_locks`` shows a ``bigint`` advisory key split in two unsigned halves."""
    return {"classid": (key >> 32) & 0xFFFFFFFF, "objid": key & 0xFFFFFFFF}


#: Serializes table creation between processes. The space keeps it apart from
#: every election key: election names and key prefixes cannot contain one.
_SCHEMA_KEY = advisory_key("celery_leader", "schema ddl")

_SCHEMA_EXISTS = (
    "SELECT to_regclass('celery_leader_lease') IS NOT NULL"
    " AND to_regclass('celery_leader_state') IS NOT NULL"
)

# Sent as one simple-protocol query: one round trip, one implicit transaction,
# so the transaction-level advisory lock covers both statements. Checking
# _SCHEMA_EXISTS first lets a role without CREATE use tables an admin made.
_CREATE_SCHEMA = f"""
SELECT pg_advisory_xact_lock({_SCHEMA_KEY});
CREATE TABLE IF NOT EXISTS celery_leader_lease (
    prefix      text    NOT NULL,
    election    text    NOT NULL,
    epoch       bigint  NOT NULL,
    token       text,
    instance_id text,
    pid         integer,
    resign      text,
    PRIMARY KEY (prefix, election)
);
CREATE TABLE IF NOT EXISTS celery_leader_state (
    prefix   text NOT NULL,
    election text NOT NULL,
    entry    text NOT NULL,
    value    text NOT NULL,
    PRIMARY KEY (prefix, election, entry)
)
"""

# Every connection: the pid identifies the server session; the settings are
# the server-side half of the lease (see the module docstring).
# synchronous_commit: a claim or epoch bump the server confirmed must survive
# a server crash, or a new leader reads older state and sends a slot again.
# Servers tuned with synchronous_commit = off get it back on for our sessions;
# stricter settings (remote_apply, ...) are kept.
_SETUP = """
SELECT pg_backend_pid(),
       set_config('statement_timeout', %(statement_ms)s, false),
       set_config('idle_session_timeout', %(idle_ms)s, false),
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s, false),
       set_config('synchronous_commit',
                  CASE current_setting('synchronous_commit')
                      WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END,
                  false)
"""

_TRY_LOCK = """
SELECT pg_backend_pid(), pg_try_advisory_lock(%(key)s::bigint), t.instance_id, t.epoch
FROM (VALUES (1)) AS one (x)
LEFT JOIN celery_leader_lease AS t ON t.prefix = %(prefix)s AND t.election = %(election)s
"""

# Runs on the session that holds the lock, so two processes can never bump the
# epoch of one election at the same time.
_TAKE_OFFICE = """
INSERT INTO celery_leader_lease AS t (prefix, election, epoch, token, instance_id, pid)
VALUES (
    %(prefix)s, %(election)s, %(floor)s::bigint + 1,
    jsonb_build_object('token', %(nonce)s::text, 'epoch', %(floor)s::bigint + 1,
                       'holder', %(instance)s::text)::text,
    %(instance)s, pg_backend_pid()
)
ON CONFLICT (prefix, election) DO UPDATE SET
    epoch = GREATEST(t.epoch, %(floor)s::bigint) + 1,
    token = jsonb_build_object('token', %(nonce)s::text,
                               'epoch', GREATEST(t.epoch, %(floor)s::bigint) + 1,
                               'holder', %(instance)s::text)::text,
    instance_id = EXCLUDED.instance_id,
    pid = EXCLUDED.pid,
    resign = NULL
RETURNING pg_backend_pid(), epoch, token
"""

# "This session holds the election's lock", for statements on the holder's session.
# The queries below that splice in this and _LOCKED_BY are built from constants
# only (hence the S608 waivers); every value travels as a parameter.
_I_HOLD = """
    SELECT FROM pg_locks
    WHERE locktype = 'advisory' AND pid = pg_backend_pid()
      AND classid = %(classid)s::oid AND objid = %(objid)s::oid AND objsubid = 1 AND granted
"""

_RENEW = f"""
SELECT pg_backend_pid(),
       set_config('idle_session_timeout', %(idle_ms)s, false),
       EXISTS ({_I_HOLD}),
       EXISTS (SELECT FROM celery_leader_lease
               WHERE prefix = %(prefix)s AND election = %(election)s AND resign = %(token)s)
"""  # noqa: S608

_RELEASE = "SELECT pg_advisory_unlock(%(key)s::bigint)"

# The claims of one round name distinct entries, so their order does not matter.
_CLAIM = f"""
WITH claim AS (
    SELECT * FROM unnest(%(entries)s::text[], %(expected)s::text[], %(new)s::text[])
        AS c (entry, expected, new)
    WHERE EXISTS ({_I_HOLD})
), inserted AS (
    INSERT INTO celery_leader_state (prefix, election, entry, value)
    SELECT %(prefix)s, %(election)s, entry, new FROM claim WHERE expected IS NULL
    ON CONFLICT (prefix, election, entry) DO NOTHING
    RETURNING entry
), updated AS (
    UPDATE celery_leader_state AS s SET value = claim.new
    FROM claim
    WHERE s.prefix = %(prefix)s AND s.election = %(election)s
      AND s.entry = claim.entry AND s.value = claim.expected
    RETURNING s.entry
)
SELECT entry FROM inserted UNION ALL SELECT entry FROM updated
"""  # noqa: S608

# A queued follower: no statement deadline for the lock wait itself, but a
# lock_timeout slice, because a waiting statement holds a snapshot and would
# hold back VACUUM's horizon for as long as it waits.
_WAIT_SETUP = """
SELECT set_config('statement_timeout', '0', false),
       set_config('lock_timeout', %(slice_ms)s, false),
       set_config('client_connection_check_interval', %(check_ms)s, false)
"""
_WAIT_LOCK = "SELECT pg_advisory_lock(%(key)s::bigint)"
_WAIT_DONE = """
SELECT set_config('statement_timeout', %(statement_ms)s, false),
       set_config('lock_timeout', '0', false),
       set_config('client_connection_check_interval', '0', false)
"""

# Whoever holds the election's lock in this database, from any connection.
_LOCKED_BY = """
    l.locktype = 'advisory'
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND l.classid = %(classid)s::oid AND l.objid = %(objid)s::oid AND l.objsubid = 1
    AND l.granted
"""

_HOLDER = f"""
SELECT t.instance_id, t.epoch, t.pid IS NOT DISTINCT FROM l.pid
FROM pg_locks AS l
LEFT JOIN celery_leader_lease AS t ON t.prefix = %(prefix)s AND t.election = %(election)s
WHERE {_LOCKED_BY}
"""  # noqa: S608

_REQUEST_RESIGN = f"""
UPDATE celery_leader_lease AS t SET resign = t.token
FROM pg_locks AS l
WHERE t.prefix = %(prefix)s AND t.election = %(election)s AND l.pid = t.pid AND {_LOCKED_BY}
RETURNING t.instance_id, t.epoch
"""  # noqa: S608

_ELECTIONS = """
SELECT election FROM celery_leader_lease WHERE prefix = %(prefix)s
UNION
SELECT election FROM celery_leader_state WHERE prefix = %(prefix)s
ORDER BY 1
"""

_LOAD_STATE = """
SELECT entry, value FROM celery_leader_state WHERE prefix = %(prefix)s AND election = %(election)s
"""


def _ms(seconds: float) -> str:
    """A duration setting in whole milliseconds, rounded up so it never shrinks."""
    return str(max(1, math.ceil(seconds * 1000)))


class _SessionGone(StoreUnavailable):
    """The session is over (closed by the server, the network or our deadline).

    Whatever it held is released, or will be as soon as the server notices,
    so a term that lived in it is lost for good.
    """


class _Session:
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

    psycopg has no client-side statement timeout, and the server's
    ``statement_timeout`` cannot help when the server or the network is what
    hangs. Shutting the socket down wakes the blocked call with an error at
    once; the session is lost with it, as it should be: a holder that missed a
    renewal deadline cannot trust its session any more.
    """

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


class _Waiter:
    """A thread queued for the advisory lock on a follower's own session.

    PostgreSQL grants the lock to it the moment the holder unlocks or its
    session ends, so a crashed holder is replaced without any polling. The
    thread then parks the session, holding the lock, for the follower's next
    ``acquire``. A waiter whose follower left closes its session, so it never
    sits on the lock.
    """

    def __init__(self, session: _Session, key: int, ttl: float, statement_ms: str) -> None:
        self.done = threading.Event()
        self._key = key
        self._ttl = ttl
        self._statement_ms = statement_ms
        self._lock = threading.Lock()
        self._session: _Session | None = session  # ours until taken or closed
        self._won = False
        self._cancelled = False
        self._finished = False
        threading.Thread(target=self._run, name="celery-leader-pg-waiter", daemon=True).start()

    def _run(self) -> None:
        session = self._session
        assert session is not None
        won = False
        try:
            with session.lock:
                conn = session.conn
                conn.execute(
                    _WAIT_SETUP, {"slice_ms": _ms(self._ttl), "check_ms": _CLIENT_CHECK_MS}
                )
                while not won and not self._cancelled:
                    try:
                        conn.execute(_WAIT_LOCK, {"key": self._key})
                    except errors.LockNotAvailable:
                        continue  # end of a slice: queue again with a fresh snapshot
                    conn.execute(_WAIT_DONE, {"statement_ms": self._statement_ms})
                    won = True
        except psycopg.Error as exc:
            # The follower's next acquire connects afresh and reports errors itself.
            logger.debug("celery-leader: lock waiter stopped: %s", exc)
        with self._lock:
            self._finished = True
            self._won = won and not self._cancelled
            drop = None if self._won else self._session
            if drop is not None:
                self._session = None
        if drop is not None:
            drop.close()
        self.done.set()

    def take(self) -> _Session | None:
        """The session, now holding the lock, if the waiter won it; else None."""
        with self._lock:
            if not self._won:
                return None
            self._won = False
            session, self._session = self._session, None
            return session

    def cancel(self, timeout: float) -> None:
        """Leave the queue; a lock won meanwhile is dropped with the session."""
        with self._lock:
            self._cancelled = True
            session = self._session
            if session is None:
                return
            if not self._finished:
                # The thread closes the session when its statement returns.
                # Held under our lock, so that close cannot race the cancel.
                try:
                    session.conn.cancel_safe(timeout=timeout)
                except psycopg.Error:
                    pass  # unreachable server: keepalives end the wait
                return
            self._session = None
            self._won = False
        session.close()


@dataclass
class _Seat:
    """What this backend keeps for one election."""

    tenure: Tenure | None = None
    session: _Session | None = None  # holds the lock while ``tenure`` is current
    waiter: _Waiter | None = None
    left: bool = False


class PostgresBackend(Backend):
    """Lease store on one PostgreSQL database (>= 14); see the module docstring."""

    #: No hold-off. The lease trusts a term until ``t_sent + ttl * 0.99 - 0.005``
    #: (``t_sent``: when it sent the acquire or renew). The server receives that
    #: statement at or after ``t_sent``, finishes it later still, and only then
    #: starts counting ``idle_session_timeout`` (ttl, rounded up to whole ms).
    #: So the session, and with it the lock, ends no earlier than
    #: ``t_sent + ttl`` by the server's clock, which is ``>= t_sent + ttl * 0.99``
    #: by ours while the clocks' rates differ by less than 1 %; the 5 ms margin
    #: covers timer rounding. The old holder's belief ends first.
    holdoff = 0.0

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        super().__init__(url, key_prefix, timeout)
        if urlsplit(url).scheme.lower() == "django":
            params, self._target = _django_params(url)
        else:
            params, self._target = _url_params(url), mask_url(url)
        self._password = str(params.get("password") or "")
        # Defaults only: what the URL or Django's OPTIONS say wins. The libpq
        # keepalives and tcp_user_timeout let a client notice a dead server or
        # network within about two store deadlines even while it sends nothing.
        params.setdefault("application_name", "celery-leader")
        params.setdefault("connect_timeout", str(max(2, math.ceil(timeout))))  # libpq minimum: 2
        params.setdefault("keepalives", "1")
        params.setdefault("keepalives_idle", str(max(1, math.ceil(timeout))))
        params.setdefault("keepalives_interval", str(max(1, math.ceil(timeout / 3))))
        params.setdefault("keepalives_count", "3")
        params.setdefault("tcp_user_timeout", _ms(timeout))
        self._params = params
        # The server cancels a slow statement a little before our own deadline
        # cuts the connection: a merely slow server then costs one failed call,
        # not the session and the term held in it.
        self._statement_ms = _ms(timeout * 0.9)
        self._lock = threading.Lock()
        self._seats: dict[str, _Seat] = {}
        self._schema_ready = False

    # -- the protocol ---------------------------------------------------------

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        key = advisory_key(self.key_prefix, election)
        with self._lock:
            seat = self._seats.setdefault(election, _Seat())
            waiter = seat.waiter
            if waiter is not None and not waiter.done.is_set():
                # Still queued for the lock: somebody holds it and is alive.
                return Acquired(None, None, ttl)
            seat.waiter = None
        session = waiter.take() if waiter is not None else None
        if session is None:
            session = self._connect(ttl)
            try:
                self._ensure_schema(session)
                ((pid, got, holder_id, holder_epoch),) = self._execute(
                    session, _TRY_LOCK, {"key": key, **self._names(election)}
                )
                self._check_pid(session, pid)
            except Exception:
                session.close()
                raise
            if not got:
                waiter = _Waiter(session, key, ttl, self._statement_ms)
                if not self._seat_back(election, seat, waiter=waiter):
                    waiter.cancel(self.timeout)
                holder = None if holder_id is None else HolderInfo(holder_id, holder_epoch, None)
                return Acquired(None, holder, ttl)
        try:
            ((pid, epoch, token),) = self._execute(
                session,
                _TAKE_OFFICE,
                {
                    **self._names(election),
                    "floor": min_epoch,
                    "nonce": uuid.uuid4().hex,
                    "instance": instance_id,
                },
            )
            self._check_pid(session, pid)
        except Exception:
            session.close()
            raise
        tenure = Tenure(token, epoch)
        if not self._seat_back(election, seat, tenure=tenure, session=session):
            session.close()
            return Acquired(None, None, ttl)
        return Acquired(tenure, None, ttl)

    def renew(self, election: str, tenure: Tenure, ttl: float) -> Renewal:
        session = self._holding(election, tenure)
        if session is None:
            return Renewal.LOST
        try:
            ((pid, _, held, resign),) = self._execute(
                session,
                _RENEW,
                {
                    **self._names(election),
                    **_lock_ids(advisory_key(self.key_prefix, election)),
                    "idle_ms": _ms(ttl),
                    "token": tenure.token,
                },
            )
            self._check_pid(session, pid)
        except _SessionGone:
            # The lock went with the session: the server may hand it to a
            # follower any moment, so stop believing now, not at the ttl.
            self._drop_session(election, session)
            return Renewal.LOST
        if not held:
            self._drop_session(election, session)
            return Renewal.LOST
        return Renewal.RESIGN if resign else Renewal.RENEWED

    def release(self, election: str, tenure: Tenure) -> None:
        with self._lock:
            seat = self._seats.get(election)
            if seat is None or seat.tenure != tenure:
                return
            session, seat.session, seat.tenure = seat.session, None, None
        if session is None:
            return  # the session ended already, and the lock with it
        try:
            # Unlocking first makes the hand-over synchronous: a queued
            # follower has the lock before this returns.
            self._execute(session, _RELEASE, {"key": advisory_key(self.key_prefix, election)})
        except _SessionGone:
            # Nothing left to release: the server freed the lock with the
            # session, or frees it when our cut reaches it (at the latest
            # after its idle timeout, one ttl).
            pass
        finally:
            session.close()

    def wait(self, election: str, timeout: float, cancel: threading.Event) -> None:
        with self._lock:
            seat = self._seats.get(election)
            waiter = seat.waiter if seat is not None else None
        # Without a queued waiter there is nothing to be woken by but cancel.
        event = waiter.done if waiter is not None else cancel
        deadline = time.monotonic() + timeout
        while not cancel.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or event.wait(min(left, _CANCEL_POLL)):
                return

    def holder(self, election: str) -> HolderInfo | None:
        params = {**self._names(election), **_lock_ids(advisory_key(self.key_prefix, election))}
        rows = self._admin(_HOLDER, params)
        if not rows:
            return None
        instance_id, epoch, current = rows[0]
        if not current:
            # Locked by a session that has not written its term yet (a
            # follower that was just granted the lock), or by a stranger.
            return HolderInfo("?", epoch or 0, None)
        return HolderInfo(instance_id, epoch, None)

    def request_resign(self, election: str) -> HolderInfo | None:
        params = {**self._names(election), **_lock_ids(advisory_key(self.key_prefix, election))}
        rows = self._admin(_REQUEST_RESIGN, params)
        return HolderInfo(rows[0][0], rows[0][1], None) if rows else None

    def elections(self) -> list[str]:
        return [name for (name,) in self._admin(_ELECTIONS, {"prefix": self.key_prefix})]

    def load_state(self, election: str) -> dict[str, str]:
        return dict(self._admin(_LOAD_STATE, self._names(election)))

    def claim(self, election: str, tenure: Tenure, claims: Sequence[Claim]) -> list[bool]:
        """Apply ``claims`` on the lock-holding session (one round trip).

        The statement checks ``pg_locks`` for the lock first, so nothing is
        written unless this very session holds it. When the session has ended,
        every claim fails, even if the server applied it before the
        connection broke: a slot is then skipped, never published twice.
        Claims naming the same entry again are applied in order, in one more
        round trip per repetition.
        """
        results = [False] * len(claims)
        session = self._holding(election, tenure)
        if session is None or not claims:
            return results
        base = {**self._names(election), **_lock_ids(advisory_key(self.key_prefix, election))}
        try:
            for indexes in _rounds(claims):
                batch = [claims[i] for i in indexes]
                rows = self._execute(
                    session,
                    _CLAIM,
                    {
                        **base,
                        "entries": [c.entry for c in batch],
                        "expected": [c.expected for c in batch],
                        "new": [c.new for c in batch],
                    },
                )
                won = {entry for (entry,) in rows}
                for i in indexes:
                    results[i] = claims[i].entry in won
        except _SessionGone:
            self._drop_session(election, session)
            return [False] * len(claims)
        return results

    def leave(self, election: str) -> None:
        with self._lock:
            seat = self._seats.pop(election, None)
            if seat is None:
                return
            seat.left = True
            waiter, session = seat.waiter, seat.session
            seat.waiter = seat.session = None
        if waiter is not None:
            waiter.cancel(self.timeout)
        if session is not None:
            session.close()

    def close(self) -> None:
        with self._lock:
            elections = list(self._seats)
        for election in elections:
            self.leave(election)

    # -- helpers ------------------------------------------------------------

    def _names(self, election: str) -> dict[str, str]:
        return {"prefix": self.key_prefix, "election": election}

    def _seat_back(
        self,
        election: str,
        seat: _Seat,
        *,
        waiter: _Waiter | None = None,
        tenure: Tenure | None = None,
        session: _Session | None = None,
    ) -> bool:
        """Record what acquire got; False if the election was left meanwhile."""
        with self._lock:
            if seat.left:
                return False
            seat.waiter, seat.tenure, seat.session = waiter, tenure, session
            return True

    def _holding(self, election: str, tenure: Tenure) -> _Session | None:
        """The session holding ``tenure``'s lock, or None when the term is over."""
        with self._lock:
            seat = self._seats.get(election)
            if seat is None or seat.tenure != tenure:
                return None
            return seat.session

    def _drop_session(self, election: str, session: _Session) -> None:
        with self._lock:
            seat = self._seats.get(election)
            if seat is not None and seat.session is session:
                seat.session = None
        session.close()

    def _connect(self, ttl: float | None) -> _Session:
        """A new dedicated session; ``ttl`` set means it may hold a lock."""
        try:
            conn = psycopg.connect(**self._params, autocommit=True)
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot connect to {self._target}: {self._describe(exc)}"
            ) from exc
        try:
            _require_server_version(conn.info.server_version, self._target)
            session = _Session(conn, 0)
            idle_ms = "0" if ttl is None else _ms(ttl)
            rows = self._execute(
                session, _SETUP, {"statement_ms": self._statement_ms, "idle_ms": idle_ms}
            )
            session.pid = rows[0][0]
        except Exception:
            conn.close()
            raise
        return session

    def _admin(self, query: str, params: Mapping[str, Any]) -> list[TupleRow]:
        """Run one statement on a short-lived connection of its own."""
        session = self._connect(None)
        try:
            self._ensure_schema(session)
            return self._execute(session, query, params)
        finally:
            session.close()

    def _ensure_schema(self, session: _Session) -> None:
        if self._schema_ready:
            return
        ((exists,),) = self._execute(session, _SCHEMA_EXISTS)
        if not exists:
            self._execute(session, _CREATE_SCHEMA)
        self._schema_ready = True

    def _execute(
        self, session: _Session, query: str, params: Mapping[str, Any] | None = None
    ) -> list[TupleRow]:
        """Run ``query`` under the store deadline; psycopg errors become StoreUnavailable."""
        with session.lock:
            watchdog = _Watchdog(session.conn, self.timeout)
            try:
                cursor = session.conn.execute(query, params)
                return cursor.fetchall() if cursor.description is not None else []
            except psycopg.Error as exc:
                cut = watchdog.stop()
                if isinstance(exc, errors.UndefinedTable):
                    self._schema_ready = False  # dropped behind our back: make it again
                if cut:
                    raise _SessionGone(
                        f"{self._target}: no answer within {self.timeout:g} s"
                    ) from exc
                message = f"{self._target}: {self._describe(exc)}"
                if session.conn.closed:
                    raise _SessionGone(message) from exc
                raise StoreUnavailable(message) from exc
            finally:
                watchdog.stop()

    def _check_pid(self, session: _Session, pid: int) -> None:
        if pid != session.pid:
            raise ConfigError(
                f"leader_url {self._target}: statements on one connection ran in two server "
                f"sessions (pid {session.pid}, then {pid}); a connection pooler in transaction "
                "or statement mode (PgBouncer pool_mode=transaction?) is in the way. "
                "celery-leader holds a session lock: connect to PostgreSQL directly or "
                "through session pooling"
            )

    def _describe(self, exc: BaseException) -> str:
        """One line from a psycopg error, without libpq's noise or any password."""
        lines = str(exc).strip().splitlines()
        text = lines[0] if lines else type(exc).__name__
        text = re.sub(r"^connection failed: ", "", text)
        text = re.sub(r'^connection to server (?:at|on) "[^"]*".*? failed: ', "", text)
        text = re.sub(r"^FATAL:\s+", "", text)
        if self._password:
            text = text.replace(self._password, "***")
        return mask_url(text)


def _rounds(claims: Sequence[Claim]) -> list[list[int]]:
    """Claim indexes in rounds: the n-th claim of every entry goes in round n."""
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, c in enumerate(claims):
        n = seen.get(c.entry, 0)
        seen[c.entry] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(i)
    return rounds


def _require_server_version(version: int, target: str) -> None:
    """ConfigError for a server without ``idle_session_timeout`` (before 14)."""
    if version < MIN_SERVER_VERSION:
        major = version // 10000 if version >= 100000 else version / 10000
        raise ConfigError(
            f"leader_url {target}: PostgreSQL {major:g} has no idle_session_timeout, which "
            "ends a paused or cut-off leader's session on time; celery-leader needs "
            "PostgreSQL 14 or later"
        )


def _url_params(url: str) -> dict[str, Any]:
    try:
        return dict(conninfo_to_dict(url))
    except psycopg.Error as exc:
        detail = mask_url(" ".join(str(exc).split()))
        raise ConfigError(
            f"leader_url {mask_url(url)!r} is not a valid PostgreSQL URL: {detail}"
        ) from None


def _django_params(url: str) -> tuple[dict[str, Any], str]:
    """libpq parameters of ``settings.DATABASES[alias]`` for ``django://alias``."""
    parts = urlsplit(url)
    alias = parts.netloc or parts.path.strip("/") or "default"
    try:
        from django.conf import settings  # type: ignore[import-untyped]
        from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(
            f"leader_url {url!r} reads Django's DATABASES, but Django is not installed"
        ) from None
    try:
        databases = settings.DATABASES
    except ImproperlyConfigured as exc:
        raise ConfigError(
            f"leader_url {url!r}: Django settings are not configured ({exc})"
        ) from None
    database = databases.get(alias)
    if database is None:
        raise ConfigError(
            f"leader_url {url!r}: settings.DATABASES has no {alias!r} "
            f"(it has {', '.join(map(repr, databases)) or 'none'})"
        )
    engine = str(database.get("ENGINE", ""))
    if not engine.endswith((".postgresql", ".postgis")):
        raise ConfigError(
            f"leader_url {url!r}: DATABASES[{alias!r}] uses ENGINE {engine!r}; celery-leader "
            "needs PostgreSQL (django.db.backends.postgresql)"
        )
    params: dict[str, Any] = {
        key: str(value)
        for key, value in (database.get("OPTIONS") or {}).items()
        if key not in _DJANGO_ONLY_OPTIONS
    }
    for key, setting in (
        ("dbname", "NAME"),
        ("user", "USER"),
        ("password", "PASSWORD"),
        ("host", "HOST"),
        ("port", "PORT"),
    ):
        if database.get(setting):
            params[key] = str(database[setting])
    where = params.get("host") or "the local socket"
    return params, f"{url} (database {params.get('dbname', '?')!r} on {where})"
