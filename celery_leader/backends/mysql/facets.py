"""The MySQL / MariaDB store's facets, on one :class:`~.session.Connector` (see the package)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from ...exceptions import StoreMisconfigured, StoreUnavailable
from ..journal import JournalWrite, journal_rounds
from ..lock import HolderInfo, Term
from ..records import Fence, FencedRecords, Write
from ..run_store import RunSummary, RunWrite
from ..session_lock import Rows, SessionGone, SessionLock
from ..sql_facets import Run, SqlEntries, SqlJournal, SqlRuns, load_state, load_state_of
from ..terms import since_of
from .entries import (
    CREATE_ENTRY,
    DELETE_ENTRY,
    EDIT_ENTRY,
    EDIT_RESULT,
    ENTRIES_SINCE,
    REPLACE_ENTRY,
)
from .session import Connector, Session
from .sql import (
    CLAIM_NEW,
    CLAIM_UPDATE,
    CLOCK,
    GET_RUN,
    HOLDER,
    JOURNAL_ROW,
    PUT_ENTRY_RUN,
    PUT_JOURNAL,
    PUT_RUN_NEW,
    PUT_RUN_REPLACE,
    RELEASE,
    RENEW,
    REQUEST_RESIGN,
    RUN_RECORDS,
    RUN_SUMMARIES,
    RUNS_OF,
    START_TERM,
    STATE_OF,
    SWEEP_RUNS,
    TRIM_JOURNAL,
    TRY_LOCK,
    lock_name,
)

T = TypeVar("T")


class MySqlLock(SessionLock[Session]):
    """Terms held as named locks on MySQL (>= 8.0) or MariaDB (>= 10.4)."""

    #: No hold-off: the server starts counting ``wait_timeout`` (the ttl rounded up)
    #: once it answered a statement sent at ``t_sent``, so the lock ends no earlier than
    #: ``t_sent + ttl``, after the old holder's belief (``t_sent + ttl * 0.99``) while
    #: clock rates differ by < 1 %. The price: a paused holder is replaced after ``ceil(ttl)``.
    holdoff = 0.0

    _RELEASE, _REQUEST_RESIGN = RELEASE, REQUEST_RESIGN
    _TRY_LOCK, _START_TERM, _CLOCK = TRY_LOCK, START_TERM, CLOCK

    _db: Connector

    def _lock_params(self, election: str) -> dict[str, Any]:
        name = lock_name(self._db.database, self._db.prefix, election)
        return {**self._db.names(election), "lock": name}

    def _renew_in(
        self, session: Session, election: str, term: Term, ttl: float
    ) -> tuple[bool, bool, float | None]:
        params = {**self._lock_params(election), "token": term.token}
        held, resign, now_us = self._row(session, RENEW, params)
        return held == 1, bool(resign), _seconds(now_us)

    def _holder(self, session: Session, election: str) -> HolderInfo | None:
        ((used_by, instance_id, epoch, token, conn),) = self._db.execute(
            session, HOLDER, self._lock_params(election)
        )
        if used_by is None:
            return None
        if conn != used_by:
            # Locked by a session that has not written its term yet (a
            # follower that was just granted the lock), or by a stranger.
            return HolderInfo("?", epoch or 0, None)
        return HolderInfo(instance_id, epoch, None, since=since_of(token))

    def _clock(self, now: Any) -> float:
        return _seconds(now)


class MySqlRecords(FencedRecords):
    """The fenced records, written only by the session holding the named lock."""

    def __init__(self, db: Connector, replica_acks: int | None) -> None:
        self._db = db
        self._replica_acks = replica_acks

    def load(self, election: str) -> dict[str, str]:
        names = self._db.names(election)
        return self._reading(election, lambda run: load_state(run, names))

    def load_some(self, election: str, keys: Sequence[str]) -> dict[str, str]:
        names = self._db.names(election)
        return self._reading(election, lambda run: load_state_of(run, STATE_OF, names, keys))

    def _reading(self, election: str, read: Callable[[Run], T]) -> T:
        """``read`` on the session holding ``election``'s lock, else on a short-lived one."""
        holding = self._db.session_of(election)
        if holding is not None:
            # A new leader loads right after it won: its own session saves a
            # connection (on a busy server, most of what a hand-over costs here).
            try:
                return read(partial(self._db.execute, holding))
            except SessionGone:
                self._db.drop_session(election, holding)
                raise
        with self._db.admin() as session:
            return read(partial(self._db.execute, session))

    def compare_and_set(self, fence: Fence, writes: Sequence[Write]) -> list[bool]:
        """Apply ``writes`` in order on the lock-holding session, in one transaction
        and one round trip, each only while ``IS_USED_LOCK`` names this session.

        Results count only once ``COMMIT`` answered: a slot is skipped, never sent twice."""
        election = fence.election
        session = self._db.holding(election, fence.term)
        if session is None or not writes:
            return [False] * len(writes)
        if self._replica_acks:
            raise StoreMisconfigured(
                f"leader_replica_acks is {self._replica_acks}, but the MySQL store cannot "
                f"confirm that a replica of {self._db.target} acknowledged a claim "
                "(semi-synchronous replication falls back to asynchronous without telling "
                "the client): set leader_replica_acks to auto or 0 (see the MySQL store's "
                "docs on fail-over)"
            )
        lock = lock_name(self._db.database, self._db.prefix, election)
        statements: list[str] = ["START TRANSACTION"]
        params: dict[str, Any] = {**self._db.names(election), "lock": lock}
        for i, w in enumerate(writes):
            template = CLAIM_NEW if w.expected is None else CLAIM_UPDATE
            for k in ("entry", "new", "expected"):
                template = template.replace(f"%({k})s", f"%({k}{i})s")
            statements.append(template)
            params.update({f"entry{i}": w.key, f"new{i}": w.new, f"expected{i}": w.expected})
        statements.append("COMMIT")
        try:
            results = self._db.results(session, ";\n".join(statements), params)
        except SessionGone:
            self._db.drop_session(election, session)
            return [False] * len(writes)
        except StoreUnavailable:
            # A statement failed: the transaction is still open on the session. End it
            # first; if even that fails, the session is unusable.
            try:
                self._db.execute(session, "ROLLBACK")
            except StoreUnavailable:
                self._db.drop_session(election, session)
                return [False] * len(writes)
            raise
        return [r.rowcount == 1 for r in results[1 : 1 + len(writes)]]


class MySqlEntries(SqlEntries[Session]):
    """Schedule entries; each edit is one transaction (see :mod:`.entries`)."""

    _CREATE, _REPLACE, _DELETE = CREATE_ENTRY, REPLACE_ENTRY, DELETE_ENTRY

    _db: Connector

    def changes_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        params = {**self._db.names(election), "since": version}
        results = self._db.on_kept(lambda s: self._db.results(s, ENTRIES_SINCE, params))
        heads, changes = results[2].rows, results[3].rows
        now = int(heads[0][0]) if heads else 0
        if now == version:
            return now, {}
        if now < version or not heads or not heads[0][1]:
            return None  # a store behind the reader, or edits the record lacks
        return now, {str(n): None if v is None else str(v) for n, v in changes}

    def _apply(self, session: Session, edit: str, params: dict[str, Any]) -> bool:
        query = EDIT_ENTRY.replace("{edit}", edit.strip())
        return self._db.results(session, query, params)[EDIT_RESULT].rowcount == 1


class MySqlRuns(SqlRuns):
    """Run records: marks in ``celery_leader_runs``, an entry's in ``..._run_records``."""

    _RUNS_OF, _SUMMARIES = RUNS_OF, RUN_SUMMARIES

    _db: Connector

    def _put_mark(self, write: RunWrite, params: dict[str, Any]) -> tuple[bool, str | None]:
        put = PUT_RUN_NEW if write.expected is None else PUT_RUN_REPLACE
        rows = self._db.kept(";\n".join([SWEEP_RUNS, put, GET_RUN]), params)
        current = str(rows[0][0]) if rows else None
        return current == write.new, current

    def _put_record(self, write: RunWrite, params: dict[str, Any]) -> tuple[bool, str | None]:
        ((ok, stored),) = self._db.kept(PUT_ENTRY_RUN, params)
        if ok:
            return True, write.new
        return False, None if stored is None else _text(stored)

    def _summarise(self, rows: Rows, params: dict[str, Any]) -> list[RunSummary]:
        # Each row: the entry, its greatest live key and its counts; the keys'
        # records in one more statement.
        kept = [(str(e), str(k)) for e, k, _ in rows if k is not None]
        records: dict[tuple[str, str], str] = {}
        if kept:
            found = self._db.kept(RUN_RECORDS, {**params, "keys": tuple(kept)})
            records = {(str(e), str(k)): str(v) for e, k, v in found}
        out = []
        for entry, last_key, counts in rows:
            if last_key is not None:
                at = (str(entry), str(last_key))
                tallies = {str(t): int(n) for t, n in json.loads(_text(counts)).items()}
                out.append(RunSummary(at[0], at[1], records.get(at), tallies))
        return out


class MySqlJournal(SqlJournal):
    """The journal in ``celery_leader_journal``: every write of a call in one
    transaction, one round trip (see :data:`~.sql.PUT_JOURNAL`)."""

    def write(self, election: str, writes: Sequence[JournalWrite]) -> None:
        if not writes:
            return
        params: dict[str, Any] = self._db.names(election)
        statements = ["START TRANSACTION"]
        i = 0
        for batch in journal_rounds(writes):
            rows, last = [], {}
            for w in batch:
                params.update({f"log{i}": w.log, f"key{i}": w.key, f"data{i}": w.data})
                params[f"skip{i}"] = w.keep - 1
                rows.append(JOURNAL_ROW.format(i=i))
                last[w.log] = i
                i += 1
            statements.append(PUT_JOURNAL.format(rows=", ".join(rows)))
            statements.extend(TRIM_JOURNAL.format(i=n) for n in last.values())
        statements.append("COMMIT")
        # A failed statement closes the kept session: the transaction goes with it.
        self._db.kept(";\n".join(s.strip() for s in statements), params)


def _text(value: object) -> str:
    """A text column's value (bytes from a server that sends JSON as binary)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _seconds(microseconds: int) -> float:
    """The server's clock (:data:`~.sql.NOW_US`) in seconds since the Unix epoch."""
    return int(microseconds) / 1e6
