"""The plan's index of due times: the first slots of a window across every entry, at the
cost of the slots listed rather than of the entries.

A plan of the console lays out entries anchored where it starts, so an entry's slots
depend on its schedule alone: each entry's first due time after a cursor is kept in a
heap, per read of the entries. A plan from the cursor or later moves the cursor there
(a step for each entry whose due time passed since, as a leader's ticks do) and then
walks the heap in due order for the first slots of the window, each entry yielding its
next slot as it is taken. A plan from before the cursor lays out a heap of its own (a
step per entry). A new read of the entries (after an edit) keeps the due times of the
entries whose stored text did not change.
"""

from __future__ import annotations

import heapq
import threading
import weakref
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from ..schedule.series import Series
from .listing import EntryIndex

_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class Due:
    """One slot of a window: its entry and due time (aware UTC)."""

    entry: str
    due: datetime


@dataclass(frozen=True)
class Window:
    """The first slots of a window, in due order; ``more``: the window holds others."""

    slots: list[Due]
    more: bool
    #: Entries whose due times only their framework can tell: not planned.
    unplanned: list[str]


@dataclass(frozen=True)
class _Planned:
    """What an entry's due times come from: its series, and the end of a pause that runs
    out by itself (no slot due before it)."""

    text: str | None
    series: Series
    resumes: datetime | None

    def after(self, moment: datetime) -> datetime | None:
        if self.resumes is not None and moment < self.resumes:
            moment = self.resumes - _MICROSECOND
        return self.series.next_after(moment)


class DueTimes:
    """Each planned entry of one read of the entries and its first due time after a
    cursor (see the module docstring)."""

    def __init__(self, index: EntryIndex, at: datetime, before: DueTimes | None = None) -> None:
        self._app = index.app
        self._cursor: datetime = at
        self._heap: list[tuple[datetime, str]] = []
        self._lock = threading.Lock()
        #: The planned entries; the others by their stored text (``None``: none), each
        #: paused until resumed, unreadable, or unplanned (those also in ``_unplanned``).
        self._planned: dict[str, _Planned] = {}
        self._left: dict[str, str | None] = {}
        self._unplanned: set[str] = set()
        kept: dict[str, datetime] = {}
        if before is not None and before._app is not index.app:
            before = None  # another console's: its code entries are not these
        if before is not None:
            with before._lock:
                if before._cursor <= at:
                    at = before._cursor
                    kept = {name: due for due, name in before._heap}
        self._cursor = at
        for name in index.names:
            text = index.records.get(name)
            old = None if before is None else before._planned.get(name)
            if old is not None and old.text == text:
                planned: _Planned | None = old  # unchanged: no parse, and its due time kept
            elif before is not None and name in before._left and before._left[name] == text:
                planned = None  # unchanged, and still not planned
                if name in before._unplanned:
                    self._unplanned.add(name)
            else:
                planned = self._plan(index, name)
            if planned is None:
                self._left[name] = text
                continue
            self._planned[name] = planned
            due = kept[name] if name in kept and planned is old else planned.after(at)
            if due is not None:
                self._heap.append((due, name))
        heapq.heapify(self._heap)

    def _plan(self, index: EntryIndex, name: str) -> _Planned | None:
        found = index.get(name)
        if found is None:
            return None
        if found.series is None:
            self._unplanned.add(name)
            return None
        stored = found.stored
        resumes = None
        if not found.enabled:
            if stored is None or stored.paused_until is None:
                return None  # paused until someone resumes it: an edit, a new read
            resumes = stored.paused_until
        return _Planned(index.records.get(name), found.series, resumes)

    def window(self, start: datetime, end: datetime, limit: int) -> Window:
        """The first ``limit`` slots due in ``(start, end]``, earliest first."""
        with self._lock:
            if self._cursor <= start <= datetime.now(timezone.utc):
                self._advance(self._heap, start)  # where every later plan starts
                self._cursor = start
                heap = self._heap
            elif start > self._cursor:
                heap = self._advance(list(self._heap), start)  # the future: a copy
            else:
                heap = [(d, n) for n, p in self._planned.items() if (d := p.after(start))]
                heapq.heapify(heap)
            return self._first(heap, end, limit)

    def _advance(
        self, heap: list[tuple[datetime, str]], moment: datetime
    ) -> list[tuple[datetime, str]]:
        """``heap`` (of due times after the cursor) moved to ``moment``: each entry due by
        then steps past it."""
        while heap and heap[0][0] <= moment:
            name = heap[0][1]
            due = self._planned[name].after(moment)
            if due is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (due, name))
        return heap

    def _first(self, heap: list[tuple[datetime, str]], end: datetime, limit: int) -> Window:
        """Walk ``heap`` in due order without changing it: a frontier of the heap's nodes
        (by position; ``-1``: an entry's following slot, not in the heap)."""
        frontier = [(heap[0][0], heap[0][1], 0)] if heap else []
        slots: list[Due] = []
        while frontier and len(slots) <= limit:
            due, name, at = heapq.heappop(frontier)
            if due > end:
                break
            slots.append(Due(name, due))
            if at >= 0:
                for child in (2 * at + 1, 2 * at + 2):
                    if child < len(heap):
                        heapq.heappush(frontier, (heap[child][0], heap[child][1], child))
            following = self._planned[name].after(due)
            if following is not None:
                heapq.heappush(frontier, (following, name, -1))
        return Window(slots[:limit], len(slots) > limit, sorted(self._unplanned))


_held: weakref.WeakKeyDictionary[EntryIndex, DueTimes] = weakref.WeakKeyDictionary()
_last: list[DueTimes] = []  # the newest, for the next read's unchanged entries
_building = threading.Lock()


def due_times(index: EntryIndex) -> DueTimes:
    """The due times of ``index`` (one read of the entries), laid out on first use."""
    found = _held.get(index)
    if found is not None:
        return found
    with _building:
        found = _held.get(index)
        if found is None:
            before = _last[0] if _last else None
            found = _held[index] = DueTimes(index, datetime.now(timezone.utc), before)
            _last[:] = [found]
        return found
