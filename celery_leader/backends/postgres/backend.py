"""The PostgreSQL backend: terms held as session advisory locks (see the package docstring)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.rows import TupleRow

from ...exceptions import StoreMisconfigured, StoreUnavailable
from ..errors import hand_back
from ..fenced import RUNS_DROPPED, Edit, RunSummary, Write, run_entry, write_rounds
from ..lock import HolderInfo, Term
from ..session_lock import SessionGone, SessionLockBackend
from ..terms import since_of
from ..waiting import LockWaiter
from .entries import (
    CREATE_ENTRY,
    DELETE_ENTRY,
    ENTRIES_FIRST_PAGE,
    ENTRIES_NEXT_PAGE,
    ENTRIES_PAGE,
    ENTRIES_SINCE,
    ENTRIES_VERSION,
    LOAD_ENTRY,
    REPLACE_ENTRY,
    VERSION_ROW,
)
from .params import connection_params
from .session import Canceller, Connector, Session, queue_for_lock
from .sql import (
    CLAIM,
    CLOCK,
    ELECTIONS,
    GET_ENTRY_RUN,
    GET_RUN,
    HOLDER,
    LOAD_STATE,
    PUT_ENTRY_RUN_MIGRATE,
    PUT_ENTRY_RUN_NEW,
    PUT_ENTRY_RUN_REPLACE,
    PUT_RUN_NEW,
    PUT_RUN_REPLACE,
    RELEASE,
    RENEW,
    REQUEST_RESIGN,
    RUN_SUMMARIES,
    RUNS_OF,
    START_TERM,
    TRY_LOCK,
    UNCLAIM,
    advisory_key,
    lock_ids,
    ms,
)

#: Entries per summary page: each page is one indexed statement of a few
#: milliseconds, whatever the ledger holds.
SUMMARIES_PAGE = 200


class PostgresBackend(SessionLockBackend[Session, TupleRow]):
    """Lease store on one PostgreSQL database (>= 14); see the package docstring."""

    #: ``clock_timestamp()`` in the acquire and renew statements: microseconds.
    clock_resolution = 1e-6

    #: No hold-off. The lease trusts a term until ``t_sent + ttl * 0.99 - 0.005``
    #: (``t_sent``: when it sent the acquire or renew). The server receives that
    #: statement at or after ``t_sent``, finishes it later still, and only then
    #: starts counting ``idle_session_timeout`` (ttl, rounded up to whole ms).
    #: So the session, and with it the lock, ends no earlier than
    #: ``t_sent + ttl`` by the server's clock, which is ``>= t_sent + ttl * 0.99``
    #: by ours while the clocks' rates differ by less than 1 %; the 5 ms margin
    #: covers timer rounding. The old holder's belief ends first.
    holdoff = 0.0

    _db: Connector

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        super().__init__(
            url, key_prefix, timeout, Connector(*connection_params(url, timeout), timeout)
        )
        #: Standbys each commit waited for at the last claim (``None``: no claim yet).
        self._sync_standbys: int | None = None

    # -- the protocol ---------------------------------------------------------

    def _try_lock(
        self, session: Session, election: str
    ) -> tuple[bool, HolderInfo | None, float | None]:
        ((pid, got, holder_id, holder_epoch, token, now),) = self._db.execute(
            session,
            TRY_LOCK,
            {"key": advisory_key(self.key_prefix, election), **self._names(election)},
        )
        self._db.check_pid(session, pid)
        holder = (
            None
            if holder_id is None
            else HolderInfo(holder_id, holder_epoch, None, since=since_of(token))
        )
        return bool(got), holder, now

    def _queue(self, session: Session, election: str, ttl: float) -> LockWaiter[Session]:
        return queue_for_lock(self._db, session, advisory_key(self.key_prefix, election), ttl)

    def _start_term(
        self, session: Session, election: str, instance_id: str, min_epoch: int
    ) -> tuple[Term, float | None]:
        ((pid, epoch, token, now),) = self._db.execute(
            session,
            START_TERM,
            {
                **self._names(election),
                "floor": min_epoch,
                "nonce": uuid.uuid4().hex,
                "instance": instance_id,
            },
        )
        self._db.check_pid(session, pid)
        return Term(token, epoch, since_of(token)), now

    def _renew_in(
        self, session: Session, election: str, term: Term, ttl: float
    ) -> tuple[bool, bool, float | None]:
        ((pid, _, held, resign, now),) = self._db.execute(
            session,
            RENEW,
            {
                **self._names(election),
                **lock_ids(advisory_key(self.key_prefix, election)),
                "idle_ms": ms(ttl),
                "token": term.token,
            },
        )
        self._db.check_pid(session, pid)
        return bool(held), bool(resign), now

    def release(self, election: str, term: Term) -> None:
        session = self._end_term(election, term)
        if session is None:
            return
        try:
            # Unlocking first makes the hand-over synchronous: a queued
            # follower has the lock before this returns.
            self._db.execute(session, RELEASE, {"key": advisory_key(self.key_prefix, election)})
        except SessionGone:
            # Nothing left to release: the server freed the lock with the
            # session, or frees it when our cut reaches it (at the latest
            # after its idle timeout, one ttl).
            pass
        finally:
            session.close()

    def store_time(self, election: str) -> float | None:
        ((now,),) = self._admin(CLOCK, {})
        return float(now)

    def holder(self, election: str) -> HolderInfo | None:
        params = {**self._names(election), **lock_ids(advisory_key(self.key_prefix, election))}
        rows = self._admin(HOLDER, params)
        if not rows:
            return None
        instance_id, epoch, token, current = rows[0]
        if not current:
            # Locked by a session that has not written its term yet (a
            # follower that was just granted the lock), or by a stranger.
            return HolderInfo("?", epoch or 0, None)
        return HolderInfo(instance_id, epoch, None, since=since_of(token))

    def request_resign(self, election: str) -> HolderInfo | None:
        params = {**self._names(election), **lock_ids(advisory_key(self.key_prefix, election))}
        rows = self._admin(REQUEST_RESIGN, params)
        if not rows:
            return None
        instance_id, epoch, token = rows[0]
        return HolderInfo(instance_id, epoch, None, since=since_of(token))

    def elections(self) -> list[str]:
        return [name for (name,) in self._admin(ELECTIONS, {"prefix": self.key_prefix})]

    def load_state(self, election: str) -> dict[str, str]:
        return dict(self._admin(LOAD_STATE, self._names(election)))

    def put_run(
        self,
        election: str,
        key: str,
        expected: str | None,
        new: str,
        ttl: float,
        *,
        keep: int = 0,
        tally: str = "",
    ) -> tuple[bool, str | None]:
        params = {**self._names(election), "key": key, "new": new, "ttl": ttl}
        entry = run_entry(key)
        if entry is None:
            if expected is None:
                rows = self._on_kept(PUT_RUN_NEW, params)
            else:
                rows = self._on_kept(PUT_RUN_REPLACE, {**params, "expected": expected})
            if rows:
                return True, new
            # Lost (the rare path: a second delivery): one more read says to what.
            current = self._on_kept(GET_RUN, params)
            return False, current[0][0] if current else None
        params.update(entry=entry, tally=tally, keep=keep, most=RUNS_DROPPED, expected=expected)
        if expected is None:
            rows = self._on_kept(PUT_ENTRY_RUN_NEW, params)
        else:
            rows = self._on_kept(PUT_ENTRY_RUN_REPLACE, params)
            if not rows:
                # Perhaps a record of the previous release, in the marks' table.
                rows = self._on_kept(PUT_ENTRY_RUN_MIGRATE, params)
        if rows:
            return True, new
        current = self._on_kept(GET_ENTRY_RUN, params)
        return False, current[0][0] if current else None

    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        params = {**self._names(election), "entry": entry, "limit": limit}
        return [(key, value) for key, value in self._on_kept(RUNS_OF, params)]

    def run_summaries(self, election: str) -> list[RunSummary]:
        out: list[RunSummary] = []
        after = ""
        while True:
            params = {**self._names(election), "after": after, "page": SUMMARIES_PAGE}
            rows = self._on_kept(RUN_SUMMARIES, params)
            for entry, counts, key, value in rows:
                if key is not None:
                    out.append(RunSummary(entry, key, value, dict(json.loads(counts))))
            if len(rows) < SUMMARIES_PAGE:
                return out
            after = rows[-1][0]

    def entries_version(self, election: str) -> int:
        rows = self._on_kept(ENTRIES_VERSION, self._names(election))
        return int(rows[0][0]) if rows else 0

    def load_entries(self, election: str) -> tuple[int, dict[str, str]]:
        # By pages: one statement of a million entries outlasted the statement
        # timeout. The version first (see ENTRIES_FIRST_PAGE).
        names = self._names(election)
        rows = self._on_kept(ENTRIES_VERSION, names)
        version = int(rows[0][0]) if rows else 0
        entries: dict[str, str] = {}
        page = self._on_kept(ENTRIES_FIRST_PAGE, {**names, "page": ENTRIES_PAGE})
        while True:
            entries.update(page)
            if len(page) < ENTRIES_PAGE:
                return version, entries
            after = page[-1][0]
            page = self._on_kept(
                ENTRIES_NEXT_PAGE, {**names, "page": ENTRIES_PAGE, "after": after}
            )

    def entries_changed_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        rows = self._on_kept(ENTRIES_SINCE, {**self._names(election), "since": version})
        head = next((row for row in rows if row[0] is None), None)
        now = int(head[1]) if head is not None else 0
        if now == version:
            return now, {}
        if now < version or head is None or not head[2]:
            return None  # a store behind the reader, or edits the record lacks
        return now, {name: value for name, value, _ in rows if name is not None}

    def edit_entries(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        """One statement per edit, on a short-lived connection (no term needed)."""
        session = self._db.connect(None)
        try:
            self._db.ensure_schema(session)
            names = self._names(election)
            if edits:
                self._db.execute(session, VERSION_ROW, names)
            results = []
            for e in edits:
                params = {**names, "name": e.key, "new": e.new, "expected": e.expected}
                if e.new is None and e.expected is None:
                    # "Remove what is not there": true when nothing is there.
                    rows = self._db.execute(session, LOAD_ENTRY, params)
                    results.append(not rows)
                    continue
                if e.expected is None:
                    query = CREATE_ENTRY
                else:
                    query = DELETE_ENTRY if e.new is None else REPLACE_ENTRY
                ((count,),) = self._db.execute(session, query, params)
                results.append(bool(count))
            return results
        finally:
            session.close()

    def compare_and_set(self, election: str, term: Term, claims: Sequence[Write]) -> list[bool]:
        """Apply ``claims`` on the lock-holding session (one round trip).

        The statement checks ``pg_locks`` for the lock first, so nothing is
        written unless this very session holds it. When the session has ended,
        every claim fails, even if the server applied it before the
        connection broke: a slot is then skipped, never published twice.
        Claims naming the same entry again are applied in order, in one more
        round trip per repetition.

        The commit waits for the synchronous standbys (see ``SETUP``); the
        statement first checks that the server's ``synchronous_standby_names``
        makes it wait for as many as :attr:`replica_acks` asks, and claims
        nothing otherwise (:class:`StoreMisconfigured`). A statement still
        running after half the store deadline is cancelled: cancelled in that
        wait, its commit stands on the primary alone, so the claims are handed
        back and :class:`StoreUnavailable` is raised; the session, and the
        term in it, carry on.
        """
        results = [False] * len(claims)
        session = self._holding(election, term)
        if session is None or not claims:
            return results
        base = {
            **self._names(election),
            **lock_ids(advisory_key(self.key_prefix, election)),
            "replica_acks": -1 if self.replica_acks is None else self.replica_acks,
        }
        try:
            for indexes in write_rounds(claims):
                batch = [claims[i] for i in indexes]
                params = {
                    **base,
                    "entries": [c.key for c in batch],
                    "expected": [c.expected for c in batch],
                    "new": [c.new for c in batch],
                }
                canceller = self._canceller(session)
                try:
                    rows = self._db.execute(session, CLAIM, params)
                except StoreUnavailable as exc:
                    if canceller is None or not canceller.stop() or isinstance(exc, SessionGone):
                        raise
                    # Cancelled before its commit: this round claimed nothing.
                    raise self._not_confirmed(session, base, claims, results) from exc
                cancelled = canceller is not None and canceller.stop()
                for entry, standbys, sync, needed in rows:
                    if entry is not None:
                        continue
                    self._sync_standbys = sync
                    if sync < needed:
                        raise self._not_synchronous(standbys, sync, needed)
                won = {entry for (entry, *_) in rows}
                for i in indexes:
                    results[i] = claims[i].key in won
                if cancelled:
                    # Maybe cancelled in the commit's wait for the standbys: it then
                    # stands on the primary alone. Undo it, send nothing.
                    raise self._not_confirmed(session, base, claims, results)
        except SessionGone:
            self._drop_session(election, session)
            return [False] * len(claims)
        return results

    def _canceller(self, session: Session) -> Canceller | None:
        """Cancels the claim statement at half the store deadline, when commits
        wait for synchronous standbys (as the last claim found; unknown at first).

        Not armed otherwise: a timer thread per claim costs a lone server 0.3 ms.
        """
        if self._sync_standbys == 0:
            return None
        return Canceller(session, self._ack_timeout, self.timeout)

    @property
    def _ack_timeout(self) -> float:
        """How long a claim's commit waits for the synchronous standbys: half the
        store deadline, so that handing it back still fits in the other half."""
        return self.timeout / 2

    def _not_confirmed(
        self, session: Session, base: Mapping[str, Any], claims: Sequence[Write], won: list[bool]
    ) -> StoreUnavailable:
        """Put back what the won ``claims`` replaced; the error that says how that went."""

        def undo(back: list[Write]) -> None:
            params = {
                **base,
                "entries": [c.key for c in back],
                "claimed": [c.new for c in back],
                "previous": [c.expected for c in back],
            }
            self._db.execute(session, UNCLAIM, params)

        done = hand_back(claims, won, undo)
        return StoreUnavailable(
            f"{sum(won)} claim(s) not confirmed by the synchronous standby(s) of "
            f"{self._db.target} within {self._ack_timeout:g} s, so a fail-over could undo "
            f"them: {done}"
        )

    def _not_synchronous(self, standbys: int, sync: int, needed: int) -> StoreMisconfigured:
        setting = "'auto'" if self.replica_acks is None else str(self.replica_acks)
        return StoreMisconfigured(
            f"leader_replica_acks is {setting}: claims must reach {needed} standby(s) before "
            f"a slot is sent, but {self._db.target} waits for {sync} synchronous standby(s) "
            f"({standbys} connected), so a promoted standby could lack them and a slot "
            "would be sent twice: list the standbys in synchronous_standby_names on the "
            "primary, or set leader_replica_acks to 0 if no standby is ever promoted"
        )
