"""The time an elector runs on: a monotonic clock, a wall clock, and waits on both.

The lease never reads ``time`` itself; it is given a :class:`Clock`, so tests
can run it on a clock they move by hand instead of sleeping in real time.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """What an elector asks of time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps: deadlines are measured on it."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch: for people and stored records only."""

    def wait(self, timeout: float, *events: threading.Event) -> bool:
        """Block until one of ``events`` is set or ``timeout`` seconds pass on this
        clock; return whether one is set."""


#: Longest a wait on several events goes without looking at all of them, in seconds.
SLICE = 0.05


class SystemClock:
    """The process's own clocks (:func:`time.monotonic`, :func:`time.time`)."""

    def monotonic(self) -> float:
        """:func:`time.monotonic`."""
        return time.monotonic()

    def time(self) -> float:
        """:func:`time.time`."""
        return time.time()

    def wait(self, timeout: float, *events: threading.Event) -> bool:
        """:meth:`threading.Event.wait` on the first event, in slices of
        :data:`SLICE` when there are others to look at."""
        first, *others = events
        if not others:
            return first.wait(timeout)
        deadline = time.monotonic() + timeout
        while True:
            if any(e.is_set() for e in others):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return first.is_set()
            if first.wait(min(left, SLICE)):
                return True


#: The clock every lease runs on unless given another.
SYSTEM_CLOCK: Clock = SystemClock()
