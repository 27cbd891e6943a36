"""``memory://``: an in-process store for tests and single-process use.

Every store opened with the same URL and key prefix in one process shares one
in-process store, so several leases in a test can compete.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..clock import SYSTEM_CLOCK, Clock
from . import StoreFacets, StoreParams
from .entry_store import Edit, EntryStore, apply_edits
from .journal import Journal, JournalWrite
from .lock import Acquired, HolderInfo, LeaseLock, Renewal, Term
from .records import Fence, FencedRecords, Write, apply_writes
from .run_store import RunStore, RunSummary, RunWrite, run_entry
from .runbook import EntryBook
from .terms import new_term


@dataclass
class _Record:
    token: str
    epoch: int
    instance_id: str
    expires: float  # on the store's clock
    since: float  # wall-clock seconds since the epoch


@dataclass
class _Store:
    cond: threading.Condition = field(default_factory=threading.Condition)
    records: dict[str, _Record] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)
    resign: dict[str, str] = field(default_factory=dict)
    state: dict[str, dict[str, str]] = field(default_factory=dict)
    #: election -> mark key -> (value, expiry on the store's clock).
    runs: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)
    #: election -> entry -> its run records (expiries on the store's clock).
    entry_runs: dict[str, dict[str, EntryBook]] = field(default_factory=dict)
    entries: dict[str, dict[str, str]] = field(default_factory=dict)
    entries_version: dict[str, int] = field(default_factory=dict)
    #: election -> entry name -> the entries version of its last edit.
    entries_edited: dict[str, dict[str, int]] = field(default_factory=dict)
    #: election -> log -> key -> record (the journal).
    journal: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    #: Set at the next release (then replaced): what waiting followers wake on.
    released: threading.Event = field(default_factory=threading.Event)

    def live(self, election: str, now: float) -> _Record | None:
        record = self.records.get(election)
        if record is not None and record.expires <= now:
            del self.records[election]
            return None
        return record


# One store per URL and key prefix in this process, outliving every opener:
# opening memory:// twice must show the same elections.
_STORES: dict[tuple[str, str], _Store] = {}
_STORES_LOCK = threading.Lock()


class _Memory:
    """What the facets of one opened memory store share: the store and its clock."""

    def __init__(self, params: StoreParams, clock: Clock = SYSTEM_CLOCK) -> None:
        self.url = params.url
        self.timeout = params.timeout
        #: What terms and run records expire on; tests give leases and their
        #: store one clock they move.
        self.clock = clock
        with _STORES_LOCK:
            self._store = _STORES.setdefault((params.url, params.key_prefix), _Store())


class MemoryLock(_Memory, LeaseLock):
    """Terms of the process's memory store."""

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        store = self._store
        with store.cond:
            now = self.clock.monotonic()
            current = store.live(election, now)
            if current is not None:
                return Acquired(None, _info(current, now), current.expires - now)
            epoch = max(store.epochs.get(election, 0), min_epoch) + 1
            store.epochs[election] = epoch
            since = self.clock.time()
            term = new_term(epoch, instance_id, since)
            store.records[election] = _Record(
                term.token, epoch, instance_id, self.clock.monotonic() + ttl, since
            )
            return Acquired(term, None, ttl)

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, None]:
        store = self._store
        with store.cond:
            current = store.live(election, self.clock.monotonic())
            if current is None or current.token != term.token:
                return Renewal.LOST, None
            current.expires = self.clock.monotonic() + ttl
            if store.resign.get(election) == term.token:
                del store.resign[election]
                return Renewal.RESIGN, None
            return Renewal.RENEWED, None

    def release(self, election: str, term: Term | None) -> None:
        if term is None:
            return  # nothing is kept per campaign
        store = self._store
        with store.cond:
            current = store.live(election, self.clock.monotonic())
            if current is not None and current.token == term.token:
                del store.records[election]
                store.released.set()
                store.released = threading.Event()

    def wait(
        self, election: str, timeout: float, cancel: threading.Event, term: Term | None = None
    ) -> bool:
        if term is not None:
            self.clock.wait(timeout, cancel)  # a holder's connection never goes
            return True
        store = self._store
        deadline = self.clock.monotonic() + timeout
        while not cancel.is_set():
            with store.cond:
                if store.live(election, self.clock.monotonic()) is None:
                    break
                released = store.released
            left = deadline - self.clock.monotonic()
            if left <= 0:
                break
            self.clock.wait(left, released, cancel)
        return True

    def holders(self, elections: Sequence[str] | None = None) -> dict[str, HolderInfo | None]:
        store = self._store
        with store.cond:
            if elections is None:
                elections = sorted(set(store.epochs) | set(store.state))
            now = self.clock.monotonic()
            found = {e: store.live(e, now) for e in elections}
            return {e: None if r is None else _info(r, now) for e, r in found.items()}

    def request_resign(self, election: str) -> HolderInfo | None:
        with self._store.cond:
            current = self._store.live(election, self.clock.monotonic())
            if current is None:
                return None
            self._store.resign[election] = current.token
            return _info(current, self.clock.monotonic())


class MemoryRecords(_Memory, FencedRecords):
    """Fenced records of the process's memory store."""

    def load(self, election: str) -> dict[str, str]:
        with self._store.cond:
            return dict(self._store.state.get(election, {}))

    def load_some(self, election: str, keys: Sequence[str]) -> dict[str, str]:
        with self._store.cond:
            state = self._store.state.get(election, {})
            return {k: state[k] for k in keys if k in state}

    def compare_and_set(self, fence: Fence, writes: Sequence[Write]) -> list[bool]:
        store = self._store
        with store.cond:
            current = store.live(fence.election, self.clock.monotonic())
            if current is None or current.token != fence.term.token:
                return [False] * len(writes)
            return apply_writes(store.state.setdefault(fence.election, {}), writes)


class MemoryRuns(_Memory, RunStore):
    """Run records of the process's memory store."""

    def put(self, election: str, write: RunWrite) -> tuple[bool, str | None]:
        w = write
        with self._store.cond:
            now = self.clock.monotonic()
            entry = run_entry(w.key)
            if entry is not None:
                books = self._store.entry_runs.setdefault(election, {})
                book = books.setdefault(entry, EntryBook())
                return book.put(w.key, w.expected, w.new, now + w.ttl, now, w.keep, w.tally)
            runs = self._store.runs.setdefault(election, {})
            stored = runs.get(w.key)
            current = stored[0] if stored is not None and stored[1] > now else None
            if current != w.expected:
                return False, current
            runs[w.key] = (w.new, now + w.ttl)
            return True, w.new

    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        with self._store.cond:
            book = self._store.entry_runs.get(election, {}).get(entry)
            return [] if book is None else book.newest(self.clock.monotonic(), limit)

    def summaries(self, election: str) -> list[RunSummary]:
        with self._store.cond:
            now = self.clock.monotonic()
            books = self._store.entry_runs.get(election, {})
            for entry in [e for e, book in books.items() if book.summary(e, now) is None]:
                del books[entry]  # every record expired: the entry goes with them
            return [s for e, book in books.items() if (s := book.summary(e, now)) is not None]


class MemoryEntries(_Memory, EntryStore):
    """Schedule entries of the process's memory store."""

    def version(self, election: str) -> int:
        with self._store.cond:
            return self._store.entries_version.get(election, 0)

    def load(self, election: str) -> tuple[int, dict[str, str]]:
        with self._store.cond:
            entries = dict(self._store.entries.get(election, {}))
            return self._store.entries_version.get(election, 0), entries

    def load_one(self, election: str, name: str) -> str | None:
        with self._store.cond:
            return self._store.entries.get(election, {}).get(name)

    def changes_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        store = self._store
        with store.cond:
            now = store.entries_version.get(election, 0)
            if version > now:
                return None
            entries = store.entries.get(election, {})
            edited = store.entries_edited.get(election, {})
            return now, {k: entries.get(k) for k, at in edited.items() if at > version}

    def edit(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        store = self._store
        with store.cond:
            results = apply_edits(store.entries.setdefault(election, {}), edits)
            if any(results):
                version = store.entries_version.get(election, 0) + 1
                store.entries_version[election] = version
                edited = store.entries_edited.setdefault(election, {})
                edited.update((e.key, version) for e, ok in zip(edits, results, strict=True) if ok)
            return results


class MemoryJournal(_Memory, Journal):
    """The journal of the process's memory store."""

    def write(self, election: str, writes: Sequence[JournalWrite]) -> None:
        with self._store.cond:
            logs = self._store.journal.setdefault(election, {})
            for w in writes:
                log = logs.setdefault(w.log, {})
                log[w.key] = w.data
                for key in sorted(log)[: max(0, len(log) - w.keep)]:
                    del log[key]

    def read(
        self, election: str, log: str, limit: int, before: str | None = None
    ) -> list[tuple[str, str]]:
        with self._store.cond:
            records = self._store.journal.get(election, {}).get(log, {})
            keys = sorted((k for k in records if before is None or k < before), reverse=True)
            return [(k, records[k]) for k in keys[:limit]]


def open_store(params: StoreParams, clock: Clock = SYSTEM_CLOCK) -> StoreFacets:
    """The memory store of ``params``, expiring on ``clock``; it outlives being closed."""
    return StoreFacets(
        params,
        MemoryLock(params, clock),
        MemoryRecords(params, clock),
        MemoryEntries(params, clock),
        MemoryRuns(params, clock),
        MemoryJournal(params, clock),
        close=lambda: None,
    )


def _info(record: _Record, now: float) -> HolderInfo:
    return HolderInfo(
        record.instance_id, record.epoch, max(0.0, record.expires - now), since=record.since
    )
