"""The leader's index of next due times: a tick touches only the entries due now.

A heap of ``(due, name)`` (whole microseconds since the epoch); a moved entry leaves its
old pair, skipped when it surfaces, and the heap is rebuilt when dead pairs outnumber
live ones: ``O(log n)`` edits, ``O(1)`` for a tick with nothing due.
"""

from __future__ import annotations

import heapq
from datetime import datetime, timedelta

from .series import EPOCH

_MICROSECOND = timedelta(microseconds=1)

#: Dead pairs tolerated before a rebuild, whatever the live count.
_SLACK = 1024


def micros(moment: datetime) -> int:
    """``moment`` (aware) as whole microseconds since the Unix epoch."""
    return (moment - EPOCH) // _MICROSECOND


class DueIndex:
    """Entries by next due time (see the module docstring)."""

    __slots__ = ("_at", "_heap")

    def __init__(self) -> None:
        self._heap: list[tuple[int, str]] = []
        self._at: dict[str, int] = {}  # name -> its current due time

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
        self._at[name] = at
        heapq.heappush(self._heap, (at, name))
        if len(self._heap) > 2 * len(self._at) + _SLACK:
            self._rebuild()

    def discard(self, name: str) -> None:
        """Take ``name`` out of the index (its pair in the heap dies)."""
        self._at.pop(name, None)

    def pop_due(self, now: datetime, limit: int) -> list[str]:
        """Take out and return up to ``limit`` names due at or before ``now``, earliest first."""
        bound = micros(now)
        heap, at = self._heap, self._at
        found: list[str] = []
        while heap and len(found) < limit and heap[0][0] <= bound:
            due, name = heapq.heappop(heap)
            if at.get(name) == due:
                del at[name]
                found.append(name)
        return found

    def seconds_until_next(self, now: datetime) -> float | None:
        """Seconds from ``now`` to the earliest due time (``None``: the index is empty)."""
        heap, at = self._heap, self._at
        while heap and at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        if not heap:
            return None
        return (heap[0][0] - micros(now)) / 1_000_000

    def clear(self) -> None:
        """Forget every entry."""
        self._heap = []
        self._at = {}

    def _rebuild(self) -> None:
        self._heap = [(due, name) for name, due in self._at.items()]
        heapq.heapify(self._heap)
