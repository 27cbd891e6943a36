"""The entries and run-records facets the SQL stores share, and their common SQL.

Every applied entry edit moves the election's entries version and records the
edited name in ``celery_leader_entries_edits``, so a reader is told what changed
since its version (the latest :data:`CHANGES_KEPT` names; older readers read all).
The journal is one table, ``celery_leader_journal`` (election, log, key); a
store writes it in its own SQL, and both read a page by a backward range scan.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from . import StoreFacets, StoreParams
from .entry_store import Edit, EntryStore, PagedEntryStore
from .journal import Journal
from .lock import LeaseLock
from .records import FencedRecords
from .run_store import RUNS_DROPPED, RunStore, RunSummary, RunWrite, run_entry
from .session_lock import Rows, S, SessionStore

#: Entries read per statement when reading them all: a few MB, so no statement
#: outlasts the store deadline.
ENTRIES_PAGE = 10_000

#: Fenced records read per statement by ``load``, and keys asked per statement
#: by ``load_some`` (a chunk of the scheduler's loading is one statement).
STATE_PAGE = 10_000
STATE_KEYS = 2_000

#: Edited names kept in the record of edits (a reader further behind reads every
#: entry), dropped every :data:`DROP_EVERY` versions so an edit seldom pays for it.
CHANGES_KEPT = 10_000
DROP_EVERY = 100

#: Entries per run-summary page: a few indexed statements of a few
#: milliseconds, whatever the ledger holds.
SUMMARIES_PAGE = 200

ELECTION = "prefix = %(prefix)s AND election = %(election)s"

ENTRIES_VERSION = f"SELECT version FROM celery_leader_entries_version WHERE {ELECTION}"  # noqa: S608

# Pages in name order (keyset); the version is read before the first page.
ENTRIES_FIRST_PAGE = f"""
SELECT name, value FROM celery_leader_entries WHERE {ELECTION}
ORDER BY name LIMIT %(page)s
"""  # noqa: S608
ENTRIES_NEXT_PAGE = f"""
SELECT name, value FROM celery_leader_entries WHERE {ELECTION} AND name > %(after)s
ORDER BY name LIMIT %(page)s
"""  # noqa: S608

LOAD_ENTRY = f"SELECT value FROM celery_leader_entries WHERE {ELECTION} AND name = %(name)s"  # noqa: S608

# A page of a log, greatest key first: a backward range scan of the primary key.
# Keys compare byte for byte (PostgreSQL: the column's "C" collation; MySQL:
# utf8mb4_bin), as the journal's callers sort them.
_LOG = f"{ELECTION} AND log = %(log)s"
JOURNAL_PAGE = f"""
SELECT log_key, data FROM celery_leader_journal WHERE {_LOG}
ORDER BY log_key DESC LIMIT %(limit)s
"""  # noqa: S608
JOURNAL_PAGE_BEFORE = f"""
SELECT log_key, data FROM celery_leader_journal WHERE {_LOG} AND log_key < %(before)s
ORDER BY log_key DESC LIMIT %(limit)s
"""  # noqa: S608

# The fenced records of an election, in pages by entry (keyset, as the entries).
STATE_FIRST_PAGE = f"""
SELECT entry, value FROM celery_leader_state WHERE {ELECTION}
ORDER BY entry LIMIT %(page)s
"""  # noqa: S608
STATE_NEXT_PAGE = f"""
SELECT entry, value FROM celery_leader_state WHERE {ELECTION} AND entry > %(after)s
ORDER BY entry LIMIT %(page)s
"""  # noqa: S608

D = TypeVar("D", bound=SessionStore[Any])

#: Runs one statement: ``(query, params) -> rows``.
Run = Callable[[str, Mapping[str, Any]], Rows]


def keyset_pages(
    run: Run, first: str, after: str, params: Mapping[str, Any], page: int
) -> Iterator[Rows]:
    """The rows of ``first`` in pages of ``page``, each page one statement made when
    asked: then ``after`` the first column of the last row read, until a short page."""
    rows = run(first, {**params, "page": page})
    while True:
        yield rows
        if len(rows) < page:
            return
        rows = run(after, {**params, "page": page, "after": rows[-1][0]})


def load_state(run: Run, names: Mapping[str, Any]) -> dict[str, str]:
    """The fenced records of the election ``names`` names, :data:`STATE_PAGE` a
    statement: one statement of a million outlasted the statement timeout. Each
    record is as its page found it (only a term's holder writes them)."""
    state: dict[str, str] = {}
    for rows in keyset_pages(run, STATE_FIRST_PAGE, STATE_NEXT_PAGE, names, STATE_PAGE):
        state.update(rows)  # text columns: pairs of str, taken as they come
    return state


def load_state_of(
    run: Run, query: str, names: Mapping[str, Any], keys: Sequence[str]
) -> dict[str, str]:
    """The fenced records of ``keys`` that exist, by ``query`` (a store's SQL of the
    records of ``%(keys)s``), :data:`STATE_KEYS` keys a statement."""
    state: dict[str, str] = {}
    unique = list(dict.fromkeys(keys))
    for i in range(0, len(unique), STATE_KEYS):
        state.update(run(query, {**names, "keys": unique[i : i + STATE_KEYS]}))
    return state


def sql_store(
    params: StoreParams,
    db: D,
    lock: Callable[[D], LeaseLock],
    records: Callable[[D, int | None], FencedRecords],
    entries: Callable[[D], EntryStore],
    runs: Callable[[D], RunStore],
    journal: Callable[[D], Journal],
) -> StoreFacets:
    """A SQL store's facets on its connector ``db``; it does not connect until first used."""
    fenced = records(db, params.replica_acks)
    return StoreFacets(params, lock(db), fenced, entries(db), runs(db), journal(db), db.close)


class SqlEntries(PagedEntryStore, Generic[S]):
    """The entries facet of a SQL store; a store adds :meth:`changes_since` and :meth:`_apply`."""

    # A store's single-entry compare-and-sets, chosen by :meth:`edit`.
    _CREATE: str
    _REPLACE: str
    _DELETE: str
    #: Run once before a batch of edits (the version row every edit locks), if set.
    _BEFORE_EDITS: str | None = None

    def __init__(self, db: SessionStore[S]) -> None:
        self._db = db

    def version(self, election: str) -> int:
        rows = self._db.kept(ENTRIES_VERSION, self._db.names(election))
        return int(rows[0][0]) if rows else 0

    def load_one(self, election: str, name: str) -> str | None:
        rows = self._db.kept(LOAD_ENTRY, {**self._db.names(election), "name": name})
        return str(rows[0][0]) if rows else None

    def load_pages(self, election: str) -> tuple[int, Iterator[dict[str, str]]]:
        # By pages, each a statement on the kept session: one statement of a million
        # entries outlasted the statement timeout. The version first: an edit made
        # while the pages are read is in the changes since it.
        version = self.version(election)
        names = self._db.names(election)
        first, after = ENTRIES_FIRST_PAGE, ENTRIES_NEXT_PAGE
        rows = keyset_pages(self._db.kept, first, after, names, ENTRIES_PAGE)
        return version, (dict(page) for page in rows)

    def edit(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        """One statement per edit, on a short-lived connection (no term needed)."""
        with self._db.admin() as session:
            names = self._db.names(election)
            if edits and self._BEFORE_EDITS is not None:
                self._db.execute(session, self._BEFORE_EDITS, names)
            results = []
            for e in edits:
                params: dict[str, Any] = {
                    **names, "name": e.key, "new": e.new, "expected": e.expected,
                    "kept": CHANGES_KEPT, "every": DROP_EVERY,
                }  # fmt: skip
                if e.expected is None and e.new is None:
                    # "Remove what is not there": true when nothing is there.
                    results.append(not self._db.execute(session, LOAD_ENTRY, params))
                    continue
                if e.expected is None:
                    edit = self._CREATE
                else:
                    edit = self._DELETE if e.new is None else self._REPLACE
                results.append(self._apply(session, edit, params))
            return results

    @abstractmethod
    def _apply(self, session: S, edit: str, params: dict[str, Any]) -> bool:
        """Run the compare-and-set ``edit`` on ``session``; whether it applied."""


class SqlRuns(RunStore):
    """The run-records facet of a SQL store: a store writes marks and an entry's
    records its way, and reads them with :attr:`_RUNS_OF`; summaries are read
    by pages of :attr:`_SUMMARIES`, one entry a row."""

    #: An entry's newest records: ``(key, value)`` rows.
    _RUNS_OF: str
    #: A page of entries after ``%(after)s``: rows that start with the entry.
    _SUMMARIES: str

    def __init__(self, db: SessionStore[Any]) -> None:
        self._db = db

    def put(self, election: str, write: RunWrite) -> tuple[bool, str | None]:
        params = {
            **self._db.names(election),
            "key": write.key,
            "new": write.new,
            "ttl": write.ttl,
            "expected": write.expected,
        }
        entry = run_entry(write.key)
        if entry is None:
            return self._put_mark(write, params)
        params.update(entry=entry, tally=write.tally, keep=write.keep, most=RUNS_DROPPED)
        return self._put_record(write, params)

    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        params = {**self._db.names(election), "entry": entry, "limit": limit}
        return [(str(key), str(value)) for key, value in self._db.kept(self._RUNS_OF, params)]

    def summaries(self, election: str) -> list[RunSummary]:
        out: list[RunSummary] = []
        after = ""
        while True:
            params = {**self._db.names(election), "after": after, "page": SUMMARIES_PAGE}
            rows = self._db.kept(self._SUMMARIES, params)
            out.extend(self._summarise(rows, params))
            if len(rows) < SUMMARIES_PAGE:
                return out
            after = str(rows[-1][0])

    @abstractmethod
    def _put_mark(self, write: RunWrite, params: dict[str, Any]) -> tuple[bool, str | None]:
        """:meth:`put` of a mark (a key starting with ``@``)."""

    @abstractmethod
    def _put_record(self, write: RunWrite, params: dict[str, Any]) -> tuple[bool, str | None]:
        """:meth:`put` of an entry's record (``params`` name its entry, tally, keep)."""

    @abstractmethod
    def _summarise(self, rows: Rows, params: dict[str, Any]) -> list[RunSummary]:
        """The summaries of one page of :attr:`_SUMMARIES` rows."""


class SqlJournal(Journal):
    """The journal facet of a SQL store, on its kept session: a store writes
    its way (:meth:`write`), and reads a page of a log as the other does."""

    def __init__(self, db: SessionStore[Any]) -> None:
        self._db = db

    def read(
        self, election: str, log: str, limit: int, before: str | None = None
    ) -> list[tuple[str, str]]:
        if limit <= 0:
            return []  # nothing to ask (and a negative LIMIT is an error)
        params: dict[str, Any] = {**self._db.names(election), "log": log, "limit": limit}
        query = JOURNAL_PAGE
        if before is not None:
            query, params["before"] = JOURNAL_PAGE_BEFORE, before
        return [(str(key), str(data)) for key, data in self._db.kept(query, params)]
