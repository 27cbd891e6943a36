"""The code entries and the store entries of the beat election, as the console lists
them: searched, filtered and paged on the server, to 100,000 entries.

The store's entries are read at most once per request (one
:meth:`~celery_leader.backends.EntryStore.load`), and not at all while the
store's entries version has not moved since the last read (:class:`EntryCache`).
They are parsed only where needed, and each at most once per version: a page
parses its own rows, and a search or the ``paused`` filter first looks for its
words in the stored JSON, then parses only the entries that have them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from ..backends import EntryStore
from ..cli.entries import CodeEntry, EntriesApp
from ..schedule.entries import CODE, Entry, EntryError
from ..schedule.series import Series
from .problems import Limits
from .times import in_words, next_fires, zone_named, zone_of

#: Rows of a page of the entries list, unless the request asks for another size.
PAGE = 50
#: The largest page a request may ask for.
MAX_PAGE = 500

# What the stored JSON says of a paused entry and of a code entry's kept pause
# (Entry.to_json: keys sorted, no spaces).
_PAUSED = '"enabled":false'
_KEPT_PAUSE = f'"kind":"{CODE}"'


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class ConsoleEntry:
    """One entry as the console shows it."""

    name: str
    source: str  # "code" or "store"
    task: str
    schedule: str  # as written: its raw form
    series: Series | None
    zone: tzinfo
    enabled: bool
    limits: Limits
    #: The stored entry (a store entry) or its kept pause (a code entry), if any.
    stored: Entry | None
    args: Any = ()
    kwargs: Any = None

    def row(self, now: datetime) -> dict[str, Any]:
        """The entry as a row of the list (and its JSON): the schedule in words and
        raw, its zone, whether it is paused (by whom, why, until when), its next
        three slots (from a pause's end, if it has one)."""
        pause = self.stored if self.stored is not None and not self.enabled else None
        until = None if pause is None else pause.paused_until
        # Due again from the pause's end: a slot due exactly then is sent.
        after = now if until is None else until - timedelta(microseconds=1)
        return {
            "name": self.name,
            "source": self.source,
            "task": self.task,
            "schedule": self.schedule,
            "words": in_words(self.series),
            "zone": str(self.zone),
            "enabled": self.enabled,
            "version": None if self.stored is None else self.stored.version,
            "paused": None
            if pause is None
            else {
                "who": pause.paused_by,
                "why": pause.paused_why,
                "until": None if until is None else until.isoformat(),
            },
            "next": [f.to_json() for f in next_fires(self.series, self.zone, after)]
            if pause is None or until is not None
            else [],
            "late_after": self.limits.late_after,
            "max_runtime": self.limits.max_runtime,
        }


class EntryIndex:
    """The entries of one read of the store, parsed on demand."""

    def __init__(self, app: EntriesApp, records: Mapping[str, str]) -> None:
        self.app = app
        self.records = records
        self.zone = zone_named(app.zone)
        # A kept pause of a code entry that left the code is no entry any more.
        self.names = sorted(
            {*app.code, *(n for n, text in records.items() if _KEPT_PAUSE not in text)}
        )
        self._parsed: dict[str, Entry | None] = {}

    def get(self, name: str) -> ConsoleEntry | None:
        """The entry ``name``, or ``None``."""
        code = self.app.code.get(name)
        if code is not None:
            return self._code(name, code)
        stored = self._stored(name)
        if stored is None or stored.kind == CODE:
            return None
        series = stored.series()
        return ConsoleEntry(
            name,
            "store",
            stored.task,
            stored.schedule_text,
            series,
            zone_of(series, zone_named(stored.tz)),
            not stored.paused_at(_now()),
            Limits.of(stored.options),
            stored,
            stored.args,
            stored.kwargs,
        )

    def _code(self, name: str, code: CodeEntry) -> ConsoleEntry:
        kept = self._stored(name)
        enabled = not kept.paused_at(_now()) if kept is not None and kept.kind == CODE else True
        return ConsoleEntry(
            name,
            "code",
            code.task,
            code.schedule,
            code.series,
            zone_of(code.series, self.zone),
            enabled,
            Limits.of(code.options),
            kept,
            code.args,
            code.kwargs,
        )

    def _stored(self, name: str) -> Entry | None:
        if name not in self._parsed:
            text = self.records.get(name)
            try:
                self._parsed[name] = None if text is None else Entry.from_json(text)
            except EntryError:
                self._parsed[name] = None  # unreadable: not shown, as the leader skips it
        return self._parsed[name]

    def search(self, query: str) -> list[str]:
        """Names of the entries whose name or task holds ``query`` (any case)."""
        words = query.strip().lower()
        if not words:
            return self.names
        found = []
        for name in self.names:
            if words in name.lower():
                found.append(name)
                continue
            code = self.app.code.get(name)
            if code is not None:
                if words in code.task.lower():
                    found.append(name)
            elif words in self.records[name].lower():
                entry = self._stored(name)
                if entry is not None and words in entry.task.lower():
                    found.append(name)
        return found

    def paused(self, names: list[str]) -> list[str]:
        """Those of ``names`` that are paused."""
        out = []
        for name in names:
            text = self.records.get(name)
            if text is None or _PAUSED not in text:
                continue
            entry = self.get(name)
            if entry is not None and not entry.enabled:
                out.append(name)
        return out


class EntryCache:
    """The entries of the last read, kept while the store's entries version stays:
    a request then costs one cheap read (the version) rather than every entry."""

    def __init__(self, app: EntriesApp) -> None:
        self.app = app
        self._held: tuple[int, EntryIndex] | None = None
        self._lock = threading.Lock()  # one reload at a time, whatever the requests

    def index(self, entries: EntryStore, election: str) -> EntryIndex:
        """The entries of ``election`` now: the kept ones if the version has not moved."""
        held = self._held
        if held is not None and entries.version(election) == held[0]:
            return held[1]
        with self._lock:
            if self._held is not held and self._held is not None:
                return self._held[1]  # another request read them meanwhile
            version, records = entries.load(election)
            index = EntryIndex(self.app, records)
            self._held = (version, index)
            return index


@dataclass(frozen=True)
class Page:
    """One page of a listing: its rows, and where it stands."""

    rows: list[dict[str, Any]]
    total: int
    page: int
    pages: int
    per: int

    def to_json(self) -> dict[str, Any]:
        """The page as JSON."""
        return {
            "entries": self.rows,
            "total": self.total,
            "page": self.page,
            "pages": self.pages,
            "per_page": self.per,
        }


def page_of(
    index: EntryIndex,
    names: list[str],
    page: int,
    per: int,
    row: Callable[[ConsoleEntry], dict[str, Any]] | None = None,
) -> Page:
    """Page ``page`` (from 1) of ``names``, ``per`` rows a page; each row made by
    ``row`` (default: :meth:`ConsoleEntry.row` at now)."""
    per = max(1, min(per, MAX_PAGE))
    pages = max(1, math.ceil(len(names) / per))
    page = max(1, min(page, pages))
    now = datetime.now(timezone.utc)
    rows = []
    for name in names[(page - 1) * per : page * per]:
        entry = index.get(name)
        if entry is not None:
            rows.append(entry.row(now) if row is None else row(entry))
    return Page(rows, len(names), page, pages, per)
