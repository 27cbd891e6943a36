"""What the leader knows of the entries kept in the store, re-read only when they change.

One cheap question a tick (the election's entries version); a record that cannot be
read is logged once and left out, and an unreachable store keeps the entries last read.
Run-now requests, kept among the entries, are held apart: an edit of requests alone
leaves the entries as they were.

A whole read goes page by page, a slice of time per call (:data:`PAGE_SLICE`), so a
scheduler acts on the entries of the first pages while the rest of a large schedule
is still coming; edits made meanwhile are read as changes at every poll. The feed
counts the names it changed (:meth:`EntryFeed.take_changes`): a reader of a million
entries touches only those.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from ..backends import EntryStore
from ..exceptions import StoreUnavailable
from .entries import Entry, EntryError
from .run_request import is_request

#: How often the leader asks whether the entries changed (one cheap store call): the
#: bound on how long an edit goes unnoticed. Schedulers wake at least this often.
POLL_INTERVAL = 0.5

#: Seconds of reading and parsing pages per call while a whole read is under way:
#: between slices a leader dispatches what it holds (a 1 s entry stays on time), and
#: loads the run state of what it read (as long a slice).
PAGE_SLICE = 0.2
#: The same for a follower, which ticks every tenth of a second: a fraction of a core,
#: leaving the rest to the leader.
FOLLOWER_PAGE_SLICE = 0.03


class EntryFeed:
    """The entries of one election, as last read from the store."""

    def __init__(
        self,
        entries: EntryStore,
        election: str,
        logger: logging.Logger,
        interval: float | None = None,
    ) -> None:
        self.store = entries
        self.election = election
        self.logger = logger
        self.interval = POLL_INTERVAL if interval is None else interval
        self._asked = float("-inf")  # time.monotonic() of the last question
        self._version: int | None = None  # the version the entries are read up to
        #: Kept in place (never copied: a copy of a million entries costs each edit).
        self._entries: dict[str, Entry] = {}
        self._requests: dict[str, str] = {}  # run-now requests, by key
        #: Names whose entry changed (added, edited, removed) since the last take.
        self._changed: set[str] = set()
        #: A whole read under way: the pages, the page being read, the names read so
        #: far (``None`` on a first read: nothing to drop at the end) and the requests.
        self._pages: Iterator[dict[str, str]] | None = None
        self._items: Iterator[tuple[str, str]] = iter(())
        self._seen: set[str] | None = None
        self._read_requests: dict[str, str] = {}
        self._base = 0  # the version a whole read under way is read up to
        #: Pages fetched in this read, and the names edited meanwhile, each with the
        #: page fetched when the edit was read: that page's copy is older.
        self._page_no = 0
        self._fresh: dict[str, int] = {}
        self._started = 0.0  # time.monotonic() when the whole read began
        self._warned: set[str] = set()
        #: Set while a follower keeps its jobs made: a store it cannot reach is then
        #: logged at DEBUG only, since the follower's lease already reports it, and
        #: pages are read in shorter slices.
        self.quiet = False

    def current(self) -> dict[str, Entry]:
        """The entries by name (store entries and kept pauses of code entries); the same
        dict every time, changed in place (see :meth:`take_changes`)."""
        loading = self._pages is not None
        now = time.monotonic()
        if now - self._asked < self.interval and not loading:
            return self._entries
        try:
            if now - self._asked >= self.interval:
                self._asked = now
                self._poll()
            if self._pages is not None:
                self._read_pages()
            self._warned.discard("")
        except StoreUnavailable as exc:
            self._pages, self._items = None, iter(())  # read again from the start
            if self.quiet:
                self.logger.debug("celery-leader: cannot read schedule entries: %s", exc)
            elif "" not in self._warned:
                self._warned.add("")
                self.logger.warning(
                    "celery-leader: cannot read schedule entries (keeping the last read): %s", exc
                )
        return self._entries

    @property
    def loading(self) -> bool:
        """Whether a whole read is under way (pages still to read)."""
        return self._pages is not None

    def take_changes(self) -> set[str]:
        """The names whose entry was added, edited or removed since the last take."""
        changed, self._changed = self._changed, set()
        return changed

    def pending(self) -> bool:
        """Whether names changed since the last :meth:`take_changes` (the store not asked)."""
        return bool(self._changed)

    def last_read(self) -> dict[str, Entry]:
        """The entries as last read, the store not asked (a scheduler's tick asks once,
        through :meth:`current`: each ask may read a slice of pages)."""
        return self._entries

    def requests(self) -> dict[str, str]:
        """The run-now requests (key -> stored text), as last read with the entries (the
        store not asked: see :meth:`last_read`)."""
        return self._requests

    def _poll(self) -> None:
        """Ask whether the entries changed; read the changes, or start a whole read."""
        if self._pages is not None:
            # A whole read under way: the edits made meanwhile are read as changes
            # (a page read later holds the same or a newer text). A store that cannot
            # tell is read again after this read ends, its version having moved.
            if self.store.version(self.election) != self._base:
                changed = self.store.changes_since(self.election, self._base)
                if changed is not None:
                    self._base, edits = changed
                    self._apply(edits)
            return
        if self._version is None:
            self._start()
            return
        version = self.store.version(self.election)
        if version == self._version:
            return
        changed = self.store.changes_since(self.election, self._version)
        if changed is None:
            self._start()
            return
        self._version, edits = changed
        self._apply(edits)

    def _start(self) -> None:
        """Begin a whole read: page by page, its version read first."""
        self._started = time.monotonic()
        self._base, self._pages = self.store.load_pages(self.election)
        self._items = iter(())
        self._seen = set() if self._entries else None
        self._read_requests = {}
        self._fresh = {}

    def _read_pages(self) -> None:
        """Read and take pages for up to :data:`PAGE_SLICE` seconds; at the last, the
        entries not seen are gone, and the edits made meanwhile are read."""
        assert self._pages is not None
        stop = time.monotonic() + (FOLLOWER_PAGE_SLICE if self.quiet else PAGE_SLICE)
        while True:
            for count, (name, text) in enumerate(self._items, 1):
                self._take(name, text)
                if count % 64 == 0 and time.monotonic() >= stop:
                    return
            page = next(self._pages, None)
            if page is None:
                break
            self._items = iter(page.items())
            self._page_no += 1
            if time.monotonic() >= stop:
                return
        self._pages, self._fresh = None, {}
        if self._seen is not None:
            for name in self._entries.keys() - self._seen:
                del self._entries[name]
                self._changed.add(name)
        self._seen = None
        self._requests, self._read_requests = self._read_requests, {}
        self.logger.info(
            "celery-leader: read %d schedule entries in %.1f s",
            len(self._entries),
            time.monotonic() - self._started,
        )
        caught = self.store.changes_since(self.election, self._base)
        if caught is None:
            # The store cannot tell: an edit meanwhile moved the version, and the
            # next poll reads every entry again.
            self._version = self._base
        else:
            self._version, edits = caught
            self._apply(edits)

    def _take(self, name: str, text: str) -> None:
        """One record of a page. A page may repeat a record: an unchanged one is no change.
        A record edited after its page was fetched keeps the edit (the page is older)."""
        if self._fresh.get(name, -1) >= self._page_no:
            return
        if is_request(name):
            self._read_requests[name] = text
            return
        if self._seen is not None:
            self._seen.add(name)
        self._put(name, text)

    def _put(self, name: str, text: str | None) -> None:
        old = self._entries.get(name)
        entry = None if text is None else self._parse(name, text)
        if entry is None:
            if old is not None:
                del self._entries[name]
                self._changed.add(name)
        elif old is None or old != entry:
            # Keyed by the entry's own name where it is the key: one string, not two.
            key = entry.name if entry.name == name else name
            self._entries[key] = entry
            self._changed.add(key)

    def _apply(self, edits: dict[str, str | None]) -> None:
        """Edits read as changes (name -> its text now, ``None``: removed)."""
        if self._pages is not None:
            # Newer than the page being taken: its copy of these is skipped.
            self._fresh.update(dict.fromkeys(edits, self._page_no))
        asked = {k: t for k, t in edits.items() if is_request(k)}
        if asked:
            requests = dict(self._requests)
            for key, text in asked.items():
                if text is None:
                    requests.pop(key, None)
                else:
                    requests[key] = text
                # A whole read under way has its own copy, taken at its end.
                if self._pages is not None and text is not None:
                    self._read_requests[key] = text
                elif self._pages is not None:
                    self._read_requests.pop(key, None)
            self._requests = requests
        for name, text in edits.items():
            if not is_request(name):
                if self._seen is not None and text is not None:
                    self._seen.add(name)
                self._put(name, text)

    def _parse(self, name: str, text: str) -> Entry | None:
        try:
            return Entry.from_json(text)
        except EntryError as exc:
            if text not in self._warned:
                self._warned.add(text)
                self.logger.error("celery-leader: skipping stored entry %s: %s", name, exc)
            return None
