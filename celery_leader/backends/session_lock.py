"""What the SQL stores share: terms held as locks of database sessions.

PostgreSQL (advisory locks) and MySQL / MariaDB (named locks) both hold a term
as a lock owned by one dedicated session, and queue a follower's session for it
with a :class:`~.waiting.LockWaiter`. A store's connector is a
:class:`SessionStore`: the one connection object its facets share. It opens
sessions and runs statements (the store's part), and tracks which session holds
which election's term, which waiter is queued, and the session that entries and
run records share. :class:`SessionLock` is the lease-lock facet on it: acquire,
renew, wait and release in the order of the store's statements, which each
store supplies. :class:`SessionGone` is how both stores' sessions say they have
ended.
"""

from __future__ import annotations

import threading
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
    """The session is over (closed by the server, the network or our deadline).

    Whatever it held is released, or will be as soon as the server notices,
    so a term that lived in it is lost for good.
    """


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
    """A SQL store's connection object, shared by its facets (see the module).

    A store supplies :meth:`connect` and :meth:`execute`, and its schema's
    statements (:attr:`schema`).
    """

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
        """Run ``query`` on ``session`` under the store deadline, in one round trip:
        the rows of its last statement. The client's errors become
        :class:`StoreUnavailable` in one line (:class:`SessionGone` when the
        session ended with them)."""

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
        """``run`` the kept session, opening it first when needed.

        A failed call closes it, so the next one starts on a fresh connection.
        """
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
    """The lease-lock facet of a SQL store (see the module).

    A store supplies the statements: :meth:`_try_lock`, :meth:`_queue` and
    :meth:`_start_term` for :meth:`acquire`, :meth:`_renew_in` for
    :meth:`renew`, :meth:`_holder` for :meth:`holders`, and two that take
    :meth:`_lock_params` alone.
    """

    #: Frees the election's lock held by the session it runs on.
    _RELEASE: str
    #: Marks the holder's term for resignation; returns its instance, epoch and token.
    _REQUEST_RESIGN: str

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

    def wait(
        self, election: str, timeout: float, cancel: threading.Event, term: Term | None = None
    ) -> bool:
        if term is not None:
            # A session that ended shows at the next renewal, one statement later.
            cancel.wait(timeout)
            return True
        waiter = self._db.waiter(election)
        # Without a queued waiter there is nothing to be woken by but cancel.
        event = waiter.done if waiter is not None else cancel
        wait_sliced(event.wait, timeout, cancel)
        return True

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
            # Nothing left to release: the server freed the lock with the
            # session, or frees it when it notices (at the latest after the
            # session's idle timeout, one ttl).
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

    @abstractmethod
    def _try_lock(self, session: S, election: str) -> tuple[bool, HolderInfo | None, float | None]:
        """Take the election's lock in ``session`` if it is free: whether it did,
        the holder the lease table names (None: no term written yet), and the
        store's clock when it answered."""

    @abstractmethod
    def _queue(self, session: S, election: str, ttl: float) -> LockWaiter[S]:
        """Queue ``session`` for the election's lock (a thread of its own)."""

    @abstractmethod
    def _start_term(
        self, session: S, election: str, instance_id: str, min_epoch: int
    ) -> tuple[Term, float | None]:
        """Write a new term, above ``min_epoch``, as ``session`` (which holds the
        lock); with the store's clock as in :meth:`_try_lock`."""

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
