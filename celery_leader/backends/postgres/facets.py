"""The PostgreSQL store's facets, on one :class:`~.session.Connector` (see the package)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from ...exceptions import StoreMisconfigured, StoreUnavailable
from ..errors import hand_back
from ..journal import JournalWrite, journal_rounds
from ..lock import HolderInfo, Term
from ..records import Fence, FencedRecords, Write, write_rounds
from ..run_store import RunSummary, RunWrite
from ..session_lock import Rows, SessionGone, SessionLock
from ..sql_facets import SqlEntries, SqlJournal, SqlRuns, load_state, load_state_of
from ..terms import since_of
from .entries import CREATE_ENTRY, DELETE_ENTRY, ENTRIES_SINCE, REPLACE_ENTRY, VERSION_ROW
from .session import Canceller, Connector, Session
from .sql import (
    CLAIM,
    CLOCK,
    GET_ENTRY_RUN,
    GET_RUN,
    HOLDER,
    PUT_ENTRY_RUN_MIGRATE,
    PUT_ENTRY_RUN_NEW,
    PUT_ENTRY_RUN_REPLACE,
    PUT_JOURNAL,
    PUT_RUN_NEW,
    PUT_RUN_REPLACE,
    RELEASE,
    RENEW,
    REQUEST_RESIGN,
    RUN_SUMMARIES,
    RUNS_OF,
    START_TERM,
    STATE_OF,
    TRY_LOCK,
    UNCLAIM,
    advisory_key,
    lock_ids,
    ms,
)


class PostgresLock(SessionLock[Session]):
    """Terms held as session advisory locks on PostgreSQL >= 14."""

    #: No hold-off: the server starts counting ``idle_session_timeout`` (ttl, rounded
    #: up to ms) after it finished a statement sent at ``t_sent``, so the lock ends no
    #: earlier than ``t_sent + ttl``, after the old holder's belief
    #: (``t_sent + ttl * 0.99 - 0.005``) while clock rates differ by < 1 %.
    holdoff = 0.0

    _RELEASE, _REQUEST_RESIGN = RELEASE, REQUEST_RESIGN
    _TRY_LOCK, _START_TERM, _CLOCK = TRY_LOCK, START_TERM, CLOCK

    _db: Connector

    def _lock_params(self, election: str) -> dict[str, Any]:
        key = advisory_key(self._db.prefix, election)
        return {**self._db.names(election), "key": key, **lock_ids(key)}

    def _renew_in(
        self, session: Session, election: str, term: Term, ttl: float
    ) -> tuple[bool, bool, float | None]:
        params = {**self._lock_params(election), "idle_ms": ms(ttl), "token": term.token}
        _, held, resign, now = self._row(session, RENEW, params)
        return bool(held), bool(resign), now

    def _holder(self, session: Session, election: str) -> HolderInfo | None:
        rows = self._db.execute(session, HOLDER, self._lock_params(election))
        if not rows:
            return None
        instance_id, epoch, token, current = rows[0]
        if not current:
            # Locked by a session that has not written its term yet (a
            # follower that was just granted the lock), or by a stranger.
            return HolderInfo("?", epoch or 0, None)
        return HolderInfo(instance_id, epoch, None, since=since_of(token))

    def _clock(self, now: Any) -> float:
        return float(now)


class PostgresRecords(FencedRecords):
    """The fenced records, claimed on the lock-holding session."""

    def __init__(self, db: Connector, replica_acks: int | None) -> None:
        self._db = db
        self._replica_acks = replica_acks
        #: Standbys each commit waited for at the last claim (``None``: no claim yet).
        self._sync_standbys: int | None = None

    def load(self, election: str) -> dict[str, str]:
        with self._db.admin() as session:
            run = partial(self._db.execute, session)
            return load_state(run, self._db.names(election))

    def load_some(self, election: str, keys: Sequence[str]) -> dict[str, str]:
        return load_state_of(self._db.kept, STATE_OF, self._db.names(election), keys)

    def compare_and_set(self, fence: Fence, writes: Sequence[Write]) -> list[bool]:
        """Apply ``writes`` on the lock-holding session (one round trip a repetition of a key).

        The statement checks ``pg_locks`` first, so only this session's lock writes; when
        the session has ended every write fails (a slot is skipped, never sent twice).
        Claims nothing when ``synchronous_standby_names`` waits for fewer standbys than
        ``replica_acks`` asks (:class:`StoreMisconfigured`). A commit still waiting for
        them at half the deadline is cancelled: it stands on the primary alone, so the
        writes are handed back and :class:`StoreUnavailable` is raised."""
        election = fence.election
        results = [False] * len(writes)
        session = self._db.holding(election, fence.term)
        if session is None or not writes:
            return results
        base = {
            **self._db.names(election),
            **lock_ids(advisory_key(self._db.prefix, election)),
            "replica_acks": -1 if self._replica_acks is None else self._replica_acks,
        }
        try:
            for indexes in write_rounds(writes):
                batch = [writes[i] for i in indexes]
                params = {
                    **base,
                    "entries": [w.key for w in batch],
                    "expected": [w.expected for w in batch],
                    "new": [w.new for w in batch],
                }
                canceller = self._canceller(session)
                try:
                    rows = self._db.execute(session, CLAIM, params)
                except StoreUnavailable as exc:
                    if canceller is None or not canceller.stop() or isinstance(exc, SessionGone):
                        raise
                    # Cancelled before its commit: this round claimed nothing.
                    raise self._not_confirmed(session, base, writes, results) from exc
                cancelled = canceller is not None and canceller.stop()
                for entry, standbys, sync, needed in rows:
                    if entry is not None:
                        continue
                    self._sync_standbys = sync
                    if sync < needed:
                        raise self._not_synchronous(standbys, sync, needed)
                won = {entry for (entry, *_) in rows}
                for i in indexes:
                    results[i] = writes[i].key in won
                if cancelled:
                    # Maybe cancelled in the commit's wait for the standbys: it then
                    # stands on the primary alone. Undo it, send nothing.
                    raise self._not_confirmed(session, base, writes, results)
        except SessionGone:
            self._db.drop_session(election, session)
            return [False] * len(writes)
        return results

    def _canceller(self, session: Session) -> Canceller | None:
        """Cancels the claim at half the store deadline when commits wait for synchronous
        standbys (as the last claim found); not armed otherwise (a timer costs 0.3 ms)."""
        if self._sync_standbys == 0:
            return None
        return Canceller(session, self._ack_timeout, self._db.timeout)

    @property
    def _ack_timeout(self) -> float:
        """A claim's wait for the standbys: half the deadline (handing back takes the rest)."""
        return self._db.timeout / 2

    def _not_confirmed(
        self, session: Session, base: Mapping[str, Any], writes: Sequence[Write], won: list[bool]
    ) -> StoreUnavailable:
        """Put back what the won ``writes`` replaced; the error that says how that went."""

        def undo(back: list[Write]) -> None:
            params = {
                **base,
                "entries": [w.key for w in back],
                "claimed": [w.new for w in back],
                "previous": [w.expected for w in back],
            }
            self._db.execute(session, UNCLAIM, params)

        done = hand_back(writes, won, undo)
        return StoreUnavailable(
            f"{sum(won)} claim(s) not confirmed by the synchronous standby(s) of "
            f"{self._db.target} within {self._ack_timeout:g} s, so a fail-over could undo "
            f"them: {done}"
        )

    def _not_synchronous(self, standbys: int, sync: int, needed: int) -> StoreMisconfigured:
        setting = "'auto'" if self._replica_acks is None else str(self._replica_acks)
        return StoreMisconfigured(
            f"leader_replica_acks is {setting}: claims must reach {needed} standby(s) before "
            f"a slot is sent, but {self._db.target} waits for {sync} synchronous standby(s) "
            f"({standbys} connected), so a promoted standby could lack them and a slot "
            "would be sent twice: list the standbys in synchronous_standby_names on the "
            "primary, or set leader_replica_acks to 0 if no standby is ever promoted"
        )


class PostgresEntries(SqlEntries[Session]):
    """Schedule entries; edits lock the version row first (see :mod:`.entries`)."""

    _CREATE, _REPLACE, _DELETE = CREATE_ENTRY, REPLACE_ENTRY, DELETE_ENTRY
    _BEFORE_EDITS = VERSION_ROW

    _db: Connector

    def changes_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        rows = self._db.kept(ENTRIES_SINCE, {**self._db.names(election), "since": version})
        head = next((row for row in rows if row[0] is None), None)
        now = int(head[1]) if head is not None else 0
        if now == version:
            return now, {}
        if now < version or head is None or not head[2]:
            return None  # a store behind the reader, or edits the record lacks
        return now, {name: value for name, value, _ in rows if name is not None}

    def _apply(self, session: Session, edit: str, params: dict[str, Any]) -> bool:
        ((count,),) = self._db.execute(session, edit, params)
        return bool(count)


class PostgresRuns(SqlRuns):
    """Run records: marks in ``celery_leader_runs``, an entry's in ``..._run_records``."""

    _RUNS_OF, _SUMMARIES = RUNS_OF, RUN_SUMMARIES

    _db: Connector

    def _put_mark(self, write: RunWrite, params: dict[str, Any]) -> tuple[bool, str | None]:
        put = PUT_RUN_NEW if write.expected is None else PUT_RUN_REPLACE
        if self._db.kept(put, params):
            return True, write.new
        # Lost (the rare path: a second delivery): one more read says to what.
        current = self._db.kept(GET_RUN, params)
        return False, current[0][0] if current else None

    def _put_record(self, write: RunWrite, params: dict[str, Any]) -> tuple[bool, str | None]:
        if write.expected is None:
            rows = self._db.kept(PUT_ENTRY_RUN_NEW, params)
        else:
            rows = self._db.kept(PUT_ENTRY_RUN_REPLACE, params)
            if not rows:
                # Perhaps a record of the previous release, in the marks' table.
                rows = self._db.kept(PUT_ENTRY_RUN_MIGRATE, params)
        if rows:
            return True, write.new
        current = self._db.kept(GET_ENTRY_RUN, params)
        return False, current[0][0] if current else None

    def _summarise(self, rows: Rows, params: dict[str, Any]) -> list[RunSummary]:
        # Each row: the entry, its counts, and its greatest live key and record.
        return [
            RunSummary(entry, key, value, dict(json.loads(counts)))
            for entry, counts, key, value in rows
            if key is not None
        ]


class PostgresJournal(SqlJournal):
    """The journal in ``celery_leader_journal``: a statement per round of writes
    (one, unless a call changes a log's ``keep``; then one transaction)."""

    _db: Connector

    def write(self, election: str, writes: Sequence[JournalWrite]) -> None:
        rounds = journal_rounds(writes)
        names = self._db.names(election)

        def run(session: Session) -> None:
            # A failed statement closes the kept session: the transaction goes with it.
            several = len(rounds) > 1
            if several:
                self._db.execute(session, "BEGIN")
            for batch in rounds:
                params = {
                    **names,
                    "logs": [w.log for w in batch],
                    "keys": [w.key for w in batch],
                    "data": [w.data for w in batch],
                    "keeps": [w.keep for w in batch],
                }
                self._db.execute(session, PUT_JOURNAL, params)
            if several:
                self._db.execute(session, "COMMIT")

        if rounds:
            self._db.on_kept(run)
