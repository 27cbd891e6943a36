"""A clock that moves only when a test moves it, for leases run in-process.

:class:`ManualClock` implements :class:`celery_leader.clock.Clock`. Lease
threads wait on it; :meth:`ManualClock.run` moves time forward from one
waiter's deadline to the next, and before each move lets every lease thread
finish what it was doing and wait again (:meth:`ManualClock.settle`). So a
test of seconds of lease time runs in milliseconds, and the order of events is
the one the deadlines give, not the one the machine's load gives.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: How often a waiter looks at its event, in real seconds: whoever sets an event
#: does not notify this clock.
POLL = 0.002

#: The threads a test's leases run in, by name.
LEASE_THREADS = "celery-leader:"

#: How far past a deadline :meth:`ManualClock.run` steps: as on a real clock, what
#: a deadline wakes happens after it, whatever rounding the sums of floats did.
PAST = 1e-6

#: Threads that waited on some manual clock: a lease thread left over from another
#: test (and its clock) is not waited for.
_SEEN: weakref.WeakKeyDictionary[threading.Thread, ManualClock] = weakref.WeakKeyDictionary()


class ManualClock:
    """Monotonic and wall time that stand still until :meth:`run` moves them."""

    def __init__(self, start: float = 1000.0, wall: float = 1_767_225_600.0) -> None:
        self._now = start
        self._offset = wall - start
        self._cond = threading.Condition()
        # thread ident -> the deadline and the events it waits for
        self._waiting: dict[int, tuple[float, tuple[threading.Event, ...]]] = {}
        self._blocked: list[threading.Event] = []

    def monotonic(self) -> float:
        with self._cond:
            return self._now

    def time(self) -> float:
        return self.monotonic() + self._offset

    def wait(self, timeout: float, *events: threading.Event) -> bool:
        me = threading.get_ident()
        with self._cond:
            deadline = self._now + max(0.0, timeout)
            self._waiting[me] = (deadline, events)
            _SEEN[threading.current_thread()] = self
            self._cond.notify_all()
            try:
                while not any(e.is_set() for e in events) and self._now < deadline:
                    self._cond.wait(POLL)
            finally:
                del self._waiting[me]
                self._cond.notify_all()
        return any(e.is_set() for e in events)

    @contextmanager
    def blocking(self, until: threading.Event) -> Iterator[None]:
        """Mark the calling lease thread as blocked until ``until`` is set (a hung store
        call, a slow callback), so that :meth:`settle` does not wait for it meanwhile."""
        with self._cond:
            self._blocked.append(until)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._blocked.remove(until)

    def settle(self, timeout: float = 2.0) -> None:
        """Return when every lease thread waits on this clock for a deadline still ahead
        (or is marked :meth:`blocking`); fail after ``timeout`` real seconds."""
        give_up = time.monotonic() + timeout
        with self._cond:
            while True:
                expected = sum(
                    t.name.startswith(LEASE_THREADS) and _SEEN.get(t, self) is self
                    for t in threading.enumerate()
                )
                # A waiter whose event is set is about to run, not parked.
                parked = sum(
                    d > self._now and not any(e.is_set() for e in events)
                    for d, events in self._waiting.values()
                )
                blocked = sum(not e.is_set() for e in self._blocked)
                if parked + blocked >= expected:
                    return
                if time.monotonic() > give_up:
                    raise AssertionError(f"lease threads did not settle: {parked} of {expected}")
                self._cond.wait(POLL)

    def run(self, seconds: float, until: Callable[[], bool] | None = None) -> bool:
        """Move time ``seconds`` ahead, deadline by deadline, settling before each step.

        With ``until``, stop as soon as it holds (looked at whenever the threads
        have settled) and return True; False when ``seconds`` passed without it.
        """
        with self._cond:
            target = self._now + seconds
        while True:
            self.settle()
            if until is not None and until():
                return True
            with self._cond:
                if self._now >= target:
                    return until is None
                ahead = [d + PAST for d, _ in self._waiting.values() if d > self._now]
                self._now = min([*ahead, target])
                self._cond.notify_all()

    def run_until(self, condition: Callable[[], bool], seconds: float, message: str = "") -> None:
        """:meth:`run` until ``condition`` holds; fail if it does not within ``seconds``."""
        if not self.run(seconds, condition):
            raise AssertionError(message or f"not within {seconds} s of lease time")
