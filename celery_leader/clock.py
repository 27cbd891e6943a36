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

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Block until ``event`` is set or ``timeout`` seconds pass on this clock;
        return whether it is set."""


class SystemClock:
    """The process's own clocks (:func:`time.monotonic`, :func:`time.time`)."""

    def monotonic(self) -> float:
        """:func:`time.monotonic`."""
        return time.monotonic()

    def time(self) -> float:
        """:func:`time.time`."""
        return time.time()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """:meth:`threading.Event.wait`."""
        return event.wait(timeout)


#: The clock every lease runs on unless given another.
SYSTEM_CLOCK: Clock = SystemClock()
