"""What the SQL stores share: terms held as locks of database sessions.

A store's connector is a :class:`SessionStore`, the one connection object its
facets share: it runs statements and tracks which session holds which election's
term, which waiter is queued and the kept session. :class:`SessionLock` is the
lease-lock facet on it.
"""

from __future__ import annotations

import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ..exceptions import StoreUnavailable
from . import StoreParams
from .lock import Acquired, HolderInfo, LeaseLock, Renewal, Term
from .terms import since_of
from .urls import mask_url
from .waiting import LockWaiter, wait_sliced

#: The rows of one statement.
Rows = list[tuple[Any, ...]]

# The elections under a key prefix that a store knows (the same tables in both stores).
ELECTIONS = """
SELECT election FROM celery_leader_lease WHERE prefix = %(prefix)s
UNION
SELECT election FROM celery_leader_state WHERE prefix = %(prefix)s
ORDER BY 1
"""


class SessionGone(StoreUnavailable):
    """The session is over, and any term that lived in it lost for good."""


class Closable(Protocol):
    """A database session: it ends, and with it any lock it holds, when closed."""

    def close(self) -> None:
        """End the session."""


S = TypeVar("S", bound=Closable)
T = TypeVar("T")


@dataclass
class Hold(Generic[S]):
    """What a store keeps for one election this process campaigns in."""

    term: Term | None = None
    session: S | None = None  # holds the lock while ``term`` is current
    waiter: LockWaiter[S] | None = None
    left: bool = False


class SessionStore(ABC, Generic[S]):
    """A SQL store's connection object: a store supplies connect, execute and schema."""

    #: (check, create) statements, in order: ``create`` runs when ``check``
    #: answers false (a fresh database, or tables of a previous release).
    schema: tuple[tuple[str, str], ...] = ()

    def __init__(self, store: StoreParams, target: str, password: str) -> None:
        self.url = store.url
        self.prefix = store.key_prefix
        #: The database as messages name it: the URL with its password masked.
        self.target = target
        #: Deadline of every statement, in seconds.
        self.timeout = store.timeout
        self._password = password
        self._schema_ready = False
        self._lock = threading.Lock()
        self._holds: dict[str, Hold[S]] = {}
        #: The session entries and run records share (workers write a run
        #: record per task: a connection each would cost more than the statement).
        self._kept: S | None = None
        self._kept_lock = threading.Lock()

    @abstractmethod
    def connect(self, ttl: float | None) -> S:
        """A new dedicated session; ``ttl`` set means it may hold a lock."""

    @abstractmethod
    def execute(self, session: S, query: str, params: Mapping[str, Any] | None = None) -> Rows:
        """Run ``query`` on ``session`` under the store deadline, in one round trip: the
        rows of its last statement (errors: :class:`StoreUnavailable`, or SessionGone)."""

    @abstractmethod
    def queue(self, session: S, params: Mapping[str, Any], ttl: float) -> LockWaiter[S]:
        """Queue ``session`` for the lock ``params`` name, in a thread of its own."""

    @abstractmethod
    def check_session(self, session: S, server_id: int) -> None:
        """Refuse a proxy or pooler that ran ``session``'s statement in another session."""

    def ensure_schema(self, session: S) -> None:
        """Create the tables on first use (a role without CREATE can use an admin's)."""
        if self._schema_ready:
            return
        for check, create in self.schema:
            if not self.execute(session, check)[0][0]:
                self.execute(session, create)
        self._schema_ready = True

    def masked(self, text: str) -> str:
        """``text`` of a client's error without the password, in the URL or alone."""
        if self._password:
            text = text.replace(self._password, "***")
        return mask_url(text)

    def names(self, election: str) -> dict[str, str]:
        """The parameters that name ``election`` in every statement."""
        return {"prefix": self.prefix, "election": election}

    # -- short-lived and kept sessions ----------------------------------------

    @contextmanager
    def admin(self) -> Iterator[S]:
        """A short-lived session of its own, for an operator's or an editor's statements."""
        session = self.connect(None)
        try:
            self.ensure_schema(session)
            yield session
        finally:
            session.close()

    def on_kept(self, run: Callable[[S], T]) -> T:
        """``run`` the kept session, opened when needed; a failed call closes it."""
        with self._kept_lock:
            if self._kept is None:
                session = self.connect(None)
                try:
                    self.ensure_schema(session)
                except Exception:
                    session.close()
                    raise
                self._kept = session
            try:
                return run(self._kept)
            except Exception:
                self._kept.close()
                self._kept = None
                raise

    def kept(self, query: str, params: Mapping[str, Any]) -> Rows:
        """:meth:`execute` ``query`` on the kept session (see :meth:`on_kept`)."""
        return self.on_kept(lambda session: self.execute(session, query, params))

    # -- the sessions of this process's campaigns ---------------------------

    def campaign(self, election: str) -> tuple[Hold[S], LockWaiter[S] | None] | None:
        """For an acquire: the election's hold and the waiter that may have won
        its lock; ``None`` while that waiter is still queued (somebody holds
        the lock and is alive)."""
        with self._lock:
            hold = self._holds.setdefault(election, Hold())
            waiter = hold.waiter
            if waiter is not None and not waiter.done.is_set():
                return None
            hold.waiter = None
            return hold, waiter

    def record_hold(
        self,
        hold: Hold[S],
        *,
        waiter: LockWaiter[S] | None = None,
        term: Term | None = None,
        session: S | None = None,
    ) -> bool:
        """Record what an acquire got; False if the election was left meanwhile."""
        with self._lock:
            if hold.left:
                return False
            hold.waiter, hold.term, hold.session = waiter, term, session
            return True

    def waiter(self, election: str) -> LockWaiter[S] | None:
        """The waiter queued for ``election``'s lock, if any."""
        with self._lock:
            hold = self._holds.get(election)
            return hold.waiter if hold is not None else None

    def holding(self, election: str, term: Term) -> S | None:
        """The session holding ``term``'s lock, or None when the term is over."""
        with self._lock:
            hold = self._holds.get(election)
            if hold is None or hold.term != term:
                return None
            return hold.session

    def session_of(self, election: str) -> S | None:
        """The session holding ``election``'s lock for this process, if any."""
        with self._lock:
            hold = self._holds.get(election)
            return hold.session if hold is not None else None

    def end_term(self, election: str, term: Term) -> S | None:
        """Forget ``term``: the session that held its lock, for release to unlock
        and close; None when the term is not current or its session ended already
        (and the lock with it)."""
        with self._lock:
            hold = self._holds.get(election)
            if hold is None or hold.term != term:
                return None
            session, hold.session, hold.term = hold.session, None, None
        return session

    def drop_session(self, election: str, session: S) -> None:
        """Close ``session``, which ended: the term in it is lost."""
        with self._lock:
            hold = self._holds.get(election)
            if hold is not None and hold.session is session:
                hold.session = None
        session.close()

    def leave(self, election: str) -> None:
        """Drop the election's waiter and session, and the lock with them."""
        with self._lock:
            hold = self._holds.pop(election, None)
            if hold is None:
                return
            hold.left = True
            waiter, session = hold.waiter, hold.session
            hold.waiter = hold.session = None
        if waiter is not None:
            waiter.cancel()
        if session is not None:
            session.close()

    def close(self) -> None:
        """Leave every election and close the kept session."""
        with self._lock:
            elections = list(self._holds)
        for election in elections:
            self.leave(election)
        with self._kept_lock:
            if self._kept is not None:
                self._kept.close()
                self._kept = None


class SessionLock(LeaseLock, Generic[S]):
    """The lease-lock facet of a SQL store; a store supplies its statements."""

    #: Both stores' clocks in the acquire and renew answers: microseconds.
    clock_resolution = 1e-6

    #: Frees the election's lock held by the session it runs on.
    _RELEASE: str
    #: Marks the holder's term for resignation; returns its instance, epoch and token.
    _REQUEST_RESIGN: str
    #: Each answers one row, the session's server id first (see :meth:`_row`): takes the
    #: lock if free (then whether it did, the lease table's instance, epoch and token,
    #: the clock); writes a new term (then its epoch, token and the clock).
    _TRY_LOCK: str
    _START_TERM: str
    #: The store's clock, alone.
    _CLOCK: str

    def __init__(self, db: SessionStore[S]) -> None:
        self._db = db
        self.url, self.timeout = db.url, db.timeout

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        found = self._db.campaign(election)
        if found is None:
            return Acquired(None, None, ttl)
        hold, waiter = found
        session = waiter.take() if waiter is not None else None
        if session is None:
            session = self._db.connect(ttl)
            try:
                self._db.ensure_schema(session)
                got, holder, now = self._try_lock(session, election)
            except Exception:
                session.close()
                raise
            if not got:
                waiter = self._queue(session, election, ttl)
                if not self._db.record_hold(hold, waiter=waiter):
                    waiter.cancel()
                return Acquired(None, holder, ttl, now)
        try:
            term, now = self._start_term(session, election, instance_id, min_epoch)
        except Exception:
            session.close()
            raise
        if not self._db.record_hold(hold, term=term, session=session):
            session.close()
            return Acquired(None, None, ttl, now)
        return Acquired(term, None, ttl, now)

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, float | None]:
        session = self._db.holding(election, term)
        if session is None:
            return Renewal.LOST, None
        try:
            held, resign, now = self._renew_in(session, election, term, ttl)
        except SessionGone:
            # The lock went with the session: the server may hand it to a
            # follower any moment, so stop believing now, not at the ttl.
            self._db.drop_session(election, session)
            return Renewal.LOST, None
        if not held:
            self._db.drop_session(election, session)
            return Renewal.LOST, now
        return Renewal.RESIGN if resign else Renewal.RENEWED, now

    def _wait_free(self, election: str, timeout: float, cancel: threading.Event) -> None:
        # A holder just waits: a session that ended shows at the next renewal.
        waiter = self._db.waiter(election)
        # Without a queued waiter there is nothing to be woken by but cancel.
        event = waiter.done if waiter is not None else cancel
        wait_sliced(event.wait, timeout, cancel)

    def release(self, election: str, term: Term | None) -> None:
        if term is None:
            self._db.leave(election)
            return
        session = self._db.end_term(election, term)
        if session is None:
            return
        try:
            # Unlocking first makes the hand-over synchronous: a queued
            # follower has the lock before this returns.
            self._db.execute(session, self._RELEASE, self._lock_params(election))
        except SessionGone:
            # Nothing left to release: the server frees the lock with the session.
            pass
        finally:
            session.close()

    def holders(self, elections: Sequence[str] | None = None) -> dict[str, HolderInfo | None]:
        with self._db.admin() as session:
            if elections is None:
                rows = self._db.execute(session, ELECTIONS, {"prefix": self._db.prefix})
                elections = [str(name) for (name,) in rows]
            return {election: self._holder(session, election) for election in elections}

    def request_resign(self, election: str) -> HolderInfo | None:
        with self._db.admin() as session:
            rows = self._db.execute(session, self._REQUEST_RESIGN, self._lock_params(election))
        if not rows:
            return None
        instance_id, epoch, token = rows[0]
        return HolderInfo(instance_id, epoch, None, since=since_of(token))

    @abstractmethod
    def _lock_params(self, election: str) -> dict[str, Any]:
        """The parameters that name ``election`` and its lock in the statements."""

    def _row(self, session: S, query: str, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """The one row ``query`` answers, less the server's id of the session (checked)."""
        ((server_id, *row),) = self._db.execute(session, query, params)
        self._db.check_session(session, server_id)
        return tuple(row)

    def _try_lock(self, session: S, election: str) -> tuple[bool, HolderInfo | None, float | None]:
        """Take the election's lock in ``session`` if it is free: whether it did,
        the holder the lease table names (None: no term written yet), and the
        store's clock when it answered."""
        got, holder_id, epoch, token, now = self._row(
            session, self._TRY_LOCK, self._lock_params(election)
        )
        holder = (
            None if holder_id is None else HolderInfo(holder_id, epoch, None, since=since_of(token))
        )
        return bool(got), holder, self._clock(now)

    def _start_term(
        self, session: S, election: str, instance_id: str, min_epoch: int
    ) -> tuple[Term, float | None]:
        """Write a new term above ``min_epoch`` as ``session``; with the store's clock."""
        params = {
            **self._lock_params(election),
            "floor": min_epoch,
            "nonce": uuid.uuid4().hex,
            "instance": instance_id,
        }
        epoch, token, now = self._row(session, self._START_TERM, params)
        return Term(str(token), int(epoch), since_of(str(token))), self._clock(now)

    def store_time(self, election: str) -> float | None:
        with self._db.admin() as session:
            ((now,),) = self._db.execute(session, self._CLOCK)
        return self._clock(now)

    @abstractmethod
    def _clock(self, now: Any) -> float:
        """The store's clock as its statements answer it, in seconds since the epoch."""

    def _queue(self, session: S, election: str, ttl: float) -> LockWaiter[S]:
        return self._db.queue(session, self._lock_params(election), ttl)

    @abstractmethod
    def _renew_in(
        self, session: S, election: str, term: Term, ttl: float
    ) -> tuple[bool, bool, float | None]:
        """Renew ``term`` in ``session``: whether the session still holds the lock,
        whether the holder is asked to resign, and the store's clock as in
        :meth:`_try_lock`."""

    @abstractmethod
    def _holder(self, session: S, election: str) -> HolderInfo | None:
        """Who holds the election's lock, read on ``session`` (any connection)."""
