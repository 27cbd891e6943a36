"""The leader's index of next due times: a tick touches only the entries due now.

A heap of the distinct due times (whole microseconds since the epoch), each with the
names due then: a large schedule shares few due times (a cron minute), so an entry costs
a slot in a list, not a pair of its own. Names due at the same time come out in the
order they were put in (the schedule's order, as Celery's own heap sends them), read
from a cursor: a list popped from its end would send them backwards. A moved entry
leaves its old place, skipped when it surfaces, and the index is rebuilt when dead
places outnumber live ones: ``O(log n)`` edits, ``O(1)`` for a tick with nothing due.
"""

from __future__ import annotations

import heapq
from datetime import datetime, timedelta
from typing import Any

from .series import EPOCH

_MICROSECOND = timedelta(microseconds=1)

#: Dead pairs tolerated before a rebuild, whatever the live count.
_SLACK = 1024


def micros(moment: datetime) -> int:
    """``moment`` (aware) as whole microseconds since the Unix epoch."""
    return (moment - EPOCH) // _MICROSECOND


class DueIndex:
    """Entries by next due time (see the module docstring)."""

    __slots__ = ("_at", "_buckets", "_heap", "_places")

    def __init__(self) -> None:
        self._heap: list[int] = []  # the distinct due times
        #: Due time -> [that time, shared by its entries; the names due then, some dead;
        #: the cursor: names before it were taken out].
        self._buckets: dict[int, list[Any]] = {}
        self._at: dict[str, int] = {}  # name -> its current due time
        self._places = 0  # names in the buckets, the dead included

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, name: object) -> bool:
        return name in self._at

    def set(self, name: str, due: datetime | None) -> None:
        """``name`` falls due at ``due`` (``None``: never again; it leaves the index)."""
        if due is None:
            self.discard(name)
            return
        at = micros(due)
        if self._at.get(name) == at:
            return
        bucket = self._buckets.get(at)
        if bucket is None:
            bucket = self._buckets[at] = [at, [], 0]
            heapq.heappush(self._heap, at)
        bucket[1].append(name)
        self._at[name] = bucket[0]
        self._places += 1
        if self._places > 2 * len(self._at) + _SLACK:
            self._rebuild()

    def discard(self, name: str) -> None:
        """Take ``name`` out of the index (its place dies)."""
        self._at.pop(name, None)

    def pop_due(self, now: datetime, limit: int) -> list[str]:
        """Take out and return up to ``limit`` names due at or before ``now``, earliest first."""
        bound = micros(now)
        heap, at, buckets = self._heap, self._at, self._buckets
        found: list[str] = []
        while heap and len(found) < limit and heap[0] <= bound:
            due = heap[0]
            bucket = buckets[due]
            names, head = bucket[1], bucket[2]
            while head < len(names) and len(found) < limit:
                name = names[head]
                head += 1
                self._places -= 1
                if at.get(name) == due:
                    del at[name]
                    found.append(name)
            bucket[2] = head
            if head == len(names):
                heapq.heappop(heap)
                del buckets[due]
        return found

    def seconds_until_next(self, now: datetime) -> float | None:
        """Seconds from ``now`` to the earliest due time (``None``: the index is empty)."""
        heap, at, buckets = self._heap, self._at, self._buckets
        while heap:
            due = heap[0]
            bucket = buckets[due]
            names, head = bucket[1], bucket[2]
            while head < len(names) and at.get(names[head]) != due:
                head += 1
                self._places -= 1
            bucket[2] = head
            if head < len(names):
                return (due - micros(now)) / 1_000_000
            heapq.heappop(heap)
            del buckets[due]
        return None

    def clear(self) -> None:
        """Forget every entry."""
        self._heap, self._buckets, self._at, self._places = [], {}, {}, 0

    def _rebuild(self) -> None:
        live, self._at = self._at, {}
        self._heap, self._buckets, self._places = [], {}, 0
        for name, due in live.items():
            bucket = self._buckets.get(due)
            if bucket is None:
                bucket = self._buckets[due] = [due, [], 0]
                self._heap.append(due)
            bucket[1].append(name)
            self._at[name] = bucket[0]
            self._places += 1
        heapq.heapify(self._heap)
