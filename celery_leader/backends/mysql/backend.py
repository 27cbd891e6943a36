"""The MySQL / MariaDB backend: terms held as named locks (see the package docstring).

:class:`MySqlBackend` is the lock part (acquire, renew, release, hold, holder,
wait); its fenced records go through :class:`~.state.StateTable`, on the
lock-holding session.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..base import Backend
from ..fenced import Write
from ..lock import Acquired, HolderInfo, Renewal, Term
from ..waiting import LockWaiter, wait_sliced
from .params import connection_params
from .session import Connector, Result, Session, SessionGone, queue_for_lock
from .sql import ELECTIONS, HOLDER, RELEASE, RENEW, REQUEST_RESIGN, START_TERM, TRY_LOCK, lock_name
from .state import StateTable


@dataclass
class _Hold:
    """What this backend keeps for one election."""

    term: Term | None = None
    session: Session | None = None  # holds the lock while ``term`` is current
    waiter: LockWaiter[Session] | None = None
    left: bool = False


class MySqlBackend(Backend):
    """Lease store on one MySQL (>= 8.0) or MariaDB (>= 10.4) database (see the package)."""

    #: No hold-off. The lease trusts a term until ``t_sent + ttl * 0.99 - 0.005``
    #: (``t_sent``: when it sent the acquire or renew). The server answers that
    #: statement at or after ``t_sent`` and only then starts counting
    #: ``wait_timeout`` (the ttl rounded *up* to whole seconds) for the next
    #: one. So the session, and with it the lock, ends no earlier than
    #: ``t_sent + ttl`` by the server's clock, which is ``>= t_sent + ttl * 0.99``
    #: by ours while the clocks' rates differ by less than 1 %. The old
    #: holder's belief ends first. The price of the rounding: a paused or cut
    #: off holder is replaced after ``ceil(ttl)`` rather than ``ttl``.
    holdoff = 0.0

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        super().__init__(url, key_prefix, timeout)
        self._db = Connector(*connection_params(url), timeout)
        self._state = StateTable(self._db, key_prefix)
        self._lock = threading.Lock()
        self._holds: dict[str, _Hold] = {}

    # -- the lock part ----------------------------------------------------------

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        lock = self._lock_name(election)
        with self._lock:
            hold = self._holds.setdefault(election, _Hold())
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
                ((conn_id, got, holder_id, holder_epoch),) = self._one(
                    session, TRY_LOCK, {"lock": lock, **self._names(election)}
                ).rows
                self._db.check_conn_id(session, conn_id)
            except Exception:
                session.close()
                raise
            if got != 1:
                waiter = queue_for_lock(self._db, session, lock)
                if not self._record_hold(election, hold, waiter=waiter):
                    waiter.cancel()
                holder = None if holder_id is None else HolderInfo(holder_id, holder_epoch, None)
                return Acquired(None, holder, ttl)
        try:
            *_, started = self._db.execute(
                session,
                START_TERM,
                {
                    **self._names(election),
                    "lock": lock,
                    "floor": min_epoch,
                    "nonce": uuid.uuid4().hex,
                    "instance": instance_id,
                },
            )
            ((conn_id, epoch, token),) = started.rows
            self._db.check_conn_id(session, conn_id)
        except Exception:
            session.close()
            raise
        term = Term(str(token), int(epoch))
        if not self._record_hold(election, hold, term=term, session=session):
            session.close()
            return Acquired(None, None, ttl)
        return Acquired(term, None, ttl)

    def renew(self, election: str, term: Term, ttl: float) -> Renewal:
        session = self._holding(election, term)
        if session is None:
            return Renewal.LOST
        try:
            ((conn_id, held, resign),) = self._one(
                session,
                RENEW,
                {**self._names(election), "lock": self._lock_name(election), "token": term.token},
            ).rows
            self._db.check_conn_id(session, conn_id)
        except SessionGone:
            # The lock went with the session: the server may hand it to a
            # follower any moment, so stop believing now, not at the ttl.
            self._drop_session(election, session)
            return Renewal.LOST
        if held != 1:
            self._drop_session(election, session)
            return Renewal.LOST
        return Renewal.RESIGN if resign else Renewal.RENEWED

    def release(self, election: str, term: Term) -> None:
        with self._lock:
            hold = self._holds.get(election)
            if hold is None or hold.term != term:
                return
            session, hold.session, hold.term = hold.session, None, None
        if session is None:
            return  # the session ended already, and the lock with it
        try:
            # Releasing first makes the hand-over synchronous: a queued
            # follower has the lock before this returns.
            self._db.execute(session, RELEASE, {"lock": self._lock_name(election)})
        except SessionGone:
            # Nothing left to release: the server freed the lock with the
            # session, or frees it when it notices (at the latest after
            # wait_timeout, one ttl rounded up).
            pass
        finally:
            session.close()

    def wait(self, election: str, timeout: float, cancel: threading.Event) -> None:
        with self._lock:
            hold = self._holds.get(election)
            waiter = hold.waiter if hold is not None else None
        # Without a queued waiter there is nothing to be woken by but cancel.
        event = waiter.done if waiter is not None else cancel
        wait_sliced(event.wait, timeout, cancel)

    def holder(self, election: str) -> HolderInfo | None:
        rows = self._admin(HOLDER, {**self._names(election), "lock": self._lock_name(election)})
        used_by, instance_id, epoch, conn = rows[-1].rows[0]
        if used_by is None:
            return None
        if conn != used_by:
            # Locked by a session that has not written its term yet (a
            # follower that was just granted the lock), or by a stranger.
            return HolderInfo("?", epoch or 0, None)
        return HolderInfo(instance_id, epoch, None)

    def request_resign(self, election: str) -> HolderInfo | None:
        params = {**self._names(election), "lock": self._lock_name(election)}
        rows = self._admin(REQUEST_RESIGN, params)[-1].rows
        return HolderInfo(rows[0][0], rows[0][1], None) if rows else None

    def elections(self) -> list[str]:
        rows = self._admin(ELECTIONS, {"prefix": self.key_prefix})[0].rows
        return [str(name) for (name,) in rows]

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

    # -- the fenced-state part ------------------------------------------------

    def load_state(self, election: str) -> dict[str, str]:
        session = self._db.connect(None)
        try:
            self._db.ensure_schema(session)
            return self._state.load(session, election)
        finally:
            session.close()

    def compare_and_set(self, election: str, term: Term, writes: Sequence[Write]) -> list[bool]:
        """Apply ``writes`` on the lock-holding session; see :meth:`.StateTable.compare_and_set`.

        Every write fails when ``term`` is over or its session ends.
        """
        session = self._holding(election, term)
        if session is None or not writes:
            return [False] * len(writes)
        try:
            return self._state.compare_and_set(
                session, election, self._lock_name(election), writes, self.replica_acks
            )
        except SessionGone:
            self._drop_session(election, session)
            return [False] * len(writes)

    # -- helpers ------------------------------------------------------------

    def _names(self, election: str) -> dict[str, str]:
        return {"prefix": self.key_prefix, "election": election}

    def _lock_name(self, election: str) -> str:
        return lock_name(self._db.database, self.key_prefix, election)

    def _one(self, session: Session, query: str, params: Mapping[str, Any]) -> Result:
        return self._db.execute(session, query, params)[0]

    def _record_hold(
        self,
        election: str,
        hold: _Hold,
        *,
        waiter: LockWaiter[Session] | None = None,
        term: Term | None = None,
        session: Session | None = None,
    ) -> bool:
        """Record what acquire got; False if the election was left meanwhile."""
        with self._lock:
            if hold.left:
                return False
            hold.waiter, hold.term, hold.session = waiter, term, session
            return True

    def _holding(self, election: str, term: Term) -> Session | None:
        """The session holding ``term``'s lock, or None when the term is over."""
        with self._lock:
            hold = self._holds.get(election)
            if hold is None or hold.term != term:
                return None
            return hold.session

    def _drop_session(self, election: str, session: Session) -> None:
        with self._lock:
            hold = self._holds.get(election)
            if hold is not None and hold.session is session:
                hold.session = None
        session.close()

    def _admin(self, query: str, params: Mapping[str, Any]) -> list[Result]:
        """Run statements on a short-lived connection of their own."""
        session = self._db.connect(None)
        try:
            self._db.ensure_schema(session)
            return self._db.execute(session, query, params)
        finally:
            session.close()
