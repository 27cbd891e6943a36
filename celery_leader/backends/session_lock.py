"""What the SQL stores keep per election while a database session holds its lock.

PostgreSQL (advisory locks) and MySQL / MariaDB (named locks) both hold a term
as a lock owned by one dedicated session, and queue a follower's session for it
with a :class:`~.waiting.LockWaiter`. :class:`SessionLockBackend` is the part of
the two backends that only tracks those sessions: which one holds which
election's term, which waiter is queued, and closing them when the election is
left, and the acquire and renew that only order the store's statements. The
statements stay in each store's backend; :class:`SessionGone` is how both
stores' sessions say they have ended.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ..exceptions import StoreUnavailable
from .base import Backend
from .lock import Acquired, HolderInfo, Renewal, Term
from .waiting import LockWaiter, wait_sliced


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
R = TypeVar("R")


class SessionConnector(Protocol[S, R]):
    """Opens a store's sessions and runs its statements (``R``: one statement's result)."""

    def connect(self, ttl: float | None) -> S:
        """A new dedicated session; ``ttl`` set means it may hold a lock."""

    def ensure_schema(self, session: S) -> None:
        """Create the tables on first use."""

    def execute(self, session: S, query: str, params: Mapping[str, Any] | None = None) -> list[R]:
        """Run ``query`` on ``session`` under the store deadline."""


@dataclass
class Hold(Generic[S]):
    """What a backend keeps for one election."""

    term: Term | None = None
    session: S | None = None  # holds the lock while ``term`` is current
    waiter: LockWaiter[S] | None = None
    left: bool = False


class SessionLockBackend(Backend, Generic[S, R]):
    """A store whose terms are locks held by sessions of ``db`` (see the module).

    A store supplies the statements: :meth:`_try_lock`, :meth:`_queue` and
    :meth:`_start_term` for :meth:`acquire`, :meth:`_renew_in` for :meth:`renew`.
    """

    def __init__(
        self, url: str, key_prefix: str, timeout: float, db: SessionConnector[S, R]
    ) -> None:
        super().__init__(url, key_prefix, timeout)
        self._db = db
        self._lock = threading.Lock()
        self._holds: dict[str, Hold[S]] = {}
        #: The session run-ledger statements share (workers write one per task:
        #: a connection each would cost more than the statement).
        self._kept: S | None = None
        self._kept_lock = threading.Lock()

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        with self._lock:
            hold = self._holds.setdefault(election, Hold())
            waiter = hold.waiter
            if waiter is not None and not waiter.done.is_set():
                # Still queued for the lock: somebody holds it and is alive.
                return Acquired(None, None, ttl)
            hold.waiter = None
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
                if not self._record_hold(hold, waiter=waiter):
                    waiter.cancel()
                return Acquired(None, holder, ttl, now)
        try:
            term, now = self._start_term(session, election, instance_id, min_epoch)
        except Exception:
            session.close()
            raise
        if not self._record_hold(hold, term=term, session=session):
            session.close()
            return Acquired(None, None, ttl, now)
        return Acquired(term, None, ttl, now)

    @abstractmethod
    def _try_lock(
        self, session: S, election: str
    ) -> tuple[bool, HolderInfo | None, float | None]:
        """Take the election's lock in ``session`` if it is free: whether it did,
        the holder the lease table names (None: no term written yet), and the
        store's clock when it answered (None: a store without one)."""

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

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, float | None]:
        session = self._holding(election, term)
        if session is None:
            return Renewal.LOST, None
        try:
            held, resign, now = self._renew_in(session, election, term, ttl)
        except SessionGone:
            # The lock went with the session: the server may hand it to a
            # follower any moment, so stop believing now, not at the ttl.
            self._drop_session(election, session)
            return Renewal.LOST, None
        if not held:
            self._drop_session(election, session)
            return Renewal.LOST, now
        return Renewal.RESIGN if resign else Renewal.RENEWED, now

    def wait(self, election: str, timeout: float, cancel: threading.Event) -> None:
        with self._lock:
            hold = self._holds.get(election)
            waiter = hold.waiter if hold is not None else None
        # Without a queued waiter there is nothing to be woken by but cancel.
        event = waiter.done if waiter is not None else cancel
        wait_sliced(event.wait, timeout, cancel)

    def leave(self, election: str) -> None:
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
        with self._lock:
            elections = list(self._holds)
        for election in elections:
            self.leave(election)
        with self._kept_lock:
            if self._kept is not None:
                self._kept.close()
                self._kept = None

    # -- for the stores' release and statements ------------------------------

    def _names(self, election: str) -> dict[str, str]:
        return {"prefix": self.key_prefix, "election": election}

    def _record_hold(
        self,
        hold: Hold[S],
        *,
        waiter: LockWaiter[S] | None = None,
        term: Term | None = None,
        session: S | None = None,
    ) -> bool:
        """Record what acquire got; False if the election was left meanwhile."""
        with self._lock:
            if hold.left:
                return False
            hold.waiter, hold.term, hold.session = waiter, term, session
            return True

    def _holding(self, election: str, term: Term) -> S | None:
        """The session holding ``term``'s lock, or None when the term is over."""
        with self._lock:
            hold = self._holds.get(election)
            if hold is None or hold.term != term:
                return None
            return hold.session

    def _end_term(self, election: str, term: Term) -> S | None:
        """Forget ``term``: the session that held its lock, for release to unlock
        and close; None when the term is not current or its session ended already
        (and the lock with it)."""
        with self._lock:
            hold = self._holds.get(election)
            if hold is None or hold.term != term:
                return None
            session, hold.session, hold.term = hold.session, None, None
        return session

    def _drop_session(self, election: str, session: S) -> None:
        with self._lock:
            hold = self._holds.get(election)
            if hold is not None and hold.session is session:
                hold.session = None
        session.close()

    def _on_kept(self, query: str, params: Mapping[str, Any]) -> list[R]:
        """Run statements on the kept session, opening it first when needed.

        A failed call closes it, so the next one starts on a fresh connection.
        """
        with self._kept_lock:
            if self._kept is None:
                session = self._db.connect(None)
                try:
                    self._db.ensure_schema(session)
                except Exception:
                    session.close()
                    raise
                self._kept = session
            try:
                return self._db.execute(self._kept, query, params)
            except Exception:
                self._kept.close()
                self._kept = None
                raise

    def _admin(self, query: str, params: Mapping[str, Any]) -> list[R]:
        """Run statements on a short-lived connection of their own."""
        session = self._db.connect(None)
        try:
            self._db.ensure_schema(session)
            return self._db.execute(session, query, params)
        finally:
            session.close()
