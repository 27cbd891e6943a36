"""The MySQL / MariaDB backend: terms held as named locks (see the package docstring).

:class:`MySqlBackend` is the lock part (acquire, renew, release, hold, holder,
wait); its fenced records go through :class:`~.state.StateTable`, on the
lock-holding session.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..fenced import RUNS_DROPPED, Edit, RunSummary, Write, run_entry
from ..lock import HolderInfo, Term
from ..session_lock import SessionGone, SessionLockBackend
from ..terms import since_of
from ..waiting import LockWaiter
from .entries import (
    CREATE_ENTRY,
    DELETE_ENTRY,
    EDIT_ENTRY,
    EDIT_RESULT,
    ENTRIES_FIRST_PAGE,
    ENTRIES_NEXT_PAGE,
    ENTRIES_PAGE,
    ENTRIES_SINCE,
    ENTRIES_VERSION,
    LOAD_ENTRY,
    REPLACE_ENTRY,
)
from .params import connection_params
from .session import Connector, Result, Session, queue_for_lock
from .sql import (
    CLOCK,
    ELECTIONS,
    GET_RUN,
    HOLDER,
    PUT_ENTRY_RUN,
    PUT_RUN_NEW,
    PUT_RUN_REPLACE,
    RELEASE,
    RENEW,
    REQUEST_RESIGN,
    RUN_RECORDS,
    RUN_SUMMARIES,
    RUNS_OF,
    START_TERM,
    SWEEP_RUNS,
    TRY_LOCK,
    lock_name,
)
from .state import StateTable

#: Entries per summary page: two indexed statements of a few milliseconds,
#: whatever the ledger holds.
SUMMARIES_PAGE = 200


class MySqlBackend(SessionLockBackend[Session, Result]):
    """Lease store on one MySQL (>= 8.0) or MariaDB (>= 10.4) database (see the package)."""

    #: ``UTC_TIMESTAMP(6)`` in the acquire and renew statements: microseconds.
    clock_resolution = 1e-6

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

    _db: Connector

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        super().__init__(url, key_prefix, timeout, Connector(*connection_params(url), timeout))
        self._state = StateTable(self._db, key_prefix)

    # -- the lock part ----------------------------------------------------------

    def _try_lock(
        self, session: Session, election: str
    ) -> tuple[bool, HolderInfo | None, float | None]:
        ((conn_id, got, holder_id, holder_epoch, token, now_us),) = self._one(
            session, TRY_LOCK, {"lock": self._lock_name(election), **self._names(election)}
        ).rows
        self._db.check_conn_id(session, conn_id)
        holder = (
            None
            if holder_id is None
            else HolderInfo(holder_id, holder_epoch, None, since=since_of(token))
        )
        return got == 1, holder, _seconds(now_us)

    def _queue(self, session: Session, election: str, ttl: float) -> LockWaiter[Session]:
        return queue_for_lock(self._db, session, self._lock_name(election), ttl)

    def _start_term(
        self, session: Session, election: str, instance_id: str, min_epoch: int
    ) -> tuple[Term, float | None]:
        *_, started = self._db.execute(
            session,
            START_TERM,
            {
                **self._names(election),
                "lock": self._lock_name(election),
                "floor": min_epoch,
                "nonce": uuid.uuid4().hex,
                "instance": instance_id,
            },
        )
        ((conn_id, epoch, token, now_us),) = started.rows
        self._db.check_conn_id(session, conn_id)
        return Term(str(token), int(epoch), since_of(str(token))), _seconds(now_us)

    def _renew_in(
        self, session: Session, election: str, term: Term, ttl: float
    ) -> tuple[bool, bool, float | None]:
        ((conn_id, held, resign, now_us),) = self._one(
            session,
            RENEW,
            {**self._names(election), "lock": self._lock_name(election), "token": term.token},
        ).rows
        self._db.check_conn_id(session, conn_id)
        return held == 1, bool(resign), _seconds(now_us)

    def release(self, election: str, term: Term) -> None:
        session = self._end_term(election, term)
        if session is None:
            return
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

    def store_time(self, election: str) -> float | None:
        ((now_us,),) = self._admin(CLOCK, {})[0].rows
        return _seconds(now_us)

    def holder(self, election: str) -> HolderInfo | None:
        rows = self._admin(HOLDER, {**self._names(election), "lock": self._lock_name(election)})
        used_by, instance_id, epoch, token, conn = rows[-1].rows[0]
        if used_by is None:
            return None
        if conn != used_by:
            # Locked by a session that has not written its term yet (a
            # follower that was just granted the lock), or by a stranger.
            return HolderInfo("?", epoch or 0, None)
        return HolderInfo(instance_id, epoch, None, since=since_of(token))

    def request_resign(self, election: str) -> HolderInfo | None:
        params = {**self._names(election), "lock": self._lock_name(election)}
        rows = self._admin(REQUEST_RESIGN, params)[-1].rows
        if not rows:
            return None
        instance_id, epoch, token = rows[0]
        return HolderInfo(instance_id, epoch, None, since=since_of(token))

    def elections(self) -> list[str]:
        rows = self._admin(ELECTIONS, {"prefix": self.key_prefix})[0].rows
        return [str(name) for (name,) in rows]

    # -- the fenced-state part ------------------------------------------------

    def load_state(self, election: str) -> dict[str, str]:
        with self._lock:
            hold = self._holds.get(election)
            holding = hold.session if hold is not None else None
        if holding is not None:
            # A new leader loads right after it won: its own session saves a
            # connection (on a busy server, most of what a hand-over costs here).
            try:
                return self._state.load(holding, election)
            except SessionGone:
                self._drop_session(election, holding)
                raise
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
            write = PUT_RUN_NEW if expected is None else PUT_RUN_REPLACE
            results = self._on_kept(
                ";\n".join([SWEEP_RUNS, write, GET_RUN]), {**params, "expected": expected}
            )
            rows = results[-1].rows
            current = str(rows[0][0]) if rows else None
            return current == new, current
        params.update(entry=entry, tally=tally, keep=keep, most=RUNS_DROPPED, expected=expected)
        ((ok, stored),) = self._on_kept(PUT_ENTRY_RUN, params)[-1].rows
        if ok:
            return True, new
        return False, None if stored is None else _text(stored)

    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        params = {**self._names(election), "entry": entry, "limit": limit}
        return [(str(k), str(v)) for k, v in self._on_kept(RUNS_OF, params)[0].rows]

    def run_summaries(self, election: str) -> list[RunSummary]:
        out: list[RunSummary] = []
        after = ""
        while True:
            params = {**self._names(election), "after": after, "page": SUMMARIES_PAGE}
            rows = self._on_kept(RUN_SUMMARIES, params)[0].rows
            kept = [(str(e), str(k)) for e, k, _ in rows if k is not None]
            records: dict[tuple[str, str], str] = {}
            if kept:
                found = self._on_kept(RUN_RECORDS, {**params, "keys": tuple(kept)})[0].rows
                records = {(str(e), str(k)): str(v) for e, k, v in found}
            for entry, last_key, counts in rows:
                if last_key is not None:
                    at = (str(entry), str(last_key))
                    tallies = {str(t): int(n) for t, n in json.loads(_text(counts)).items()}
                    out.append(RunSummary(at[0], at[1], records.get(at), tallies))
            if len(rows) < SUMMARIES_PAGE:
                return out
            after = str(rows[-1][0])

    # -- schedule entries (no lock needed) -----------------------------------

    def entries_version(self, election: str) -> int:
        rows = self._on_kept(ENTRIES_VERSION, self._names(election))[0].rows
        return int(rows[0][0]) if rows else 0

    def load_entries(self, election: str) -> tuple[int, dict[str, str]]:
        # By pages: one statement of a million entries outlasts the store
        # deadline. The version first (see ENTRIES_FIRST_PAGE).
        names = self._names(election)
        rows = self._on_kept(ENTRIES_VERSION, names)[0].rows
        version = int(rows[0][0]) if rows else 0
        entries: dict[str, str] = {}
        page = self._on_kept(ENTRIES_FIRST_PAGE, {**names, "page": ENTRIES_PAGE})[0].rows
        while True:
            entries.update((str(name), str(value)) for name, value in page)
            if len(page) < ENTRIES_PAGE:
                return version, entries
            after = page[-1][0]
            page = self._on_kept(
                ENTRIES_NEXT_PAGE, {**names, "page": ENTRIES_PAGE, "after": after}
            )[0].rows

    def entries_changed_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        results = self._on_kept(ENTRIES_SINCE, {**self._names(election), "since": version})
        heads, changes = results[2].rows, results[3].rows
        now = int(heads[0][0]) if heads else 0
        if now == version:
            return now, {}
        if now < version or not heads or not heads[0][1]:
            return None  # a store behind the reader, or edits the record lacks
        return now, {str(n): None if v is None else str(v) for n, v in changes}

    def edit_entries(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        """One transaction per edit, on a short-lived connection (no lock needed)."""
        session = self._db.connect(None)
        try:
            self._db.ensure_schema(session)
            results = []
            for e in edits:
                params = {**self._names(election), "name": e.key, "new": e.new}
                params["expected"] = e.expected
                if e.expected is None and e.new is None:
                    # "Remove what is not there": true when nothing is there.
                    results.append(not self._db.execute(session, LOAD_ENTRY, params)[0].rows)
                    continue
                if e.expected is None:
                    edit = CREATE_ENTRY
                else:
                    edit = DELETE_ENTRY if e.new is None else REPLACE_ENTRY
                query = EDIT_ENTRY.replace("{edit}", edit.strip())
                done = self._db.execute(session, query, params)
                results.append(done[EDIT_RESULT].rowcount == 1)
            return results
        finally:
            session.close()

    # -- helpers ------------------------------------------------------------

    def _lock_name(self, election: str) -> str:
        return lock_name(self._db.database, self.key_prefix, election)

    def _one(self, session: Session, query: str, params: Mapping[str, Any]) -> Result:
        return self._db.execute(session, query, params)[0]


def _text(value: object) -> str:
    """A text column's value (bytes from a server that sends JSON as binary)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _seconds(microseconds: int) -> float:
    """The server's clock (:data:`~.sql.NOW_US`) in seconds since the Unix epoch."""
    return int(microseconds) / 1e6
