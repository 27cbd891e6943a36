"""The time an elector runs on (a :class:`Clock`, which tests move by hand), and the
store's clock as this process measures it."""

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


#: Samples a :class:`StoreClock` keeps: the offset is read from where all their
#: bounds agree (or, when they do not, from the narrowest). Eight renewals are a
#: few seconds at the default renew interval, enough for one quiet round trip
#: among congested ones, and few enough that a slow drift of this host's clock
#: is followed within them.
SAMPLES = 8

#: Added to the two samples' error bounds before a disagreement counts as a jump
#: of the store's clock rather than noise: scheduling delay inside the store
#: (a Lua script, a statement) is not part of either round trip's bound.
JUMP_SLACK = 0.5


class StoreClock:
    """The store's clock, read through this process's monotonic clock.

    NTP-style: the store read its time inside the round trip, so at the midpoint it
    is known within half the round trip (plus the store's resolution). Kept against
    the *monotonic* clock, so a step of this host's wall clock does not move it.
    """

    def __init__(self, local: Clock = SYSTEM_CLOCK) -> None:
        self.local = local
        # (store time - local monotonic at the midpoint, error bound), newest last
        self._samples: list[tuple[float, float]] = []
        self._best: tuple[float, float] | None = None
        #: Times the store's clock jumped against this one (a fail-over to a
        #: server whose clock differs, or a step of the store's own clock).
        self.jumps = 0
        #: Size of the last jump in seconds (positive: the store's clock went forward).
        self.last_jump = 0.0

    def sample(
        self, store_time: float, sent: float, received: float, resolution: float = 0.0
    ) -> None:
        """Take the store's ``store_time`` answered to a request sent at ``sent`` and
        answered at ``received`` (both on :meth:`monotonic`); ``resolution`` is how
        coarsely the store reports its time (truncated to it, as HTTP ``Date`` is)."""
        half = max(0.0, received - sent) / 2
        # The store read its clock between sent and received; truncation means
        # its true time lies in [store_time, store_time + resolution).
        offset = store_time + resolution / 2 - (sent + half)
        error = half + resolution / 2
        best = self._best
        if best is not None and abs(offset - best[0]) > error + best[1] + JUMP_SLACK:
            self.jumps += 1
            self.last_jump = offset - best[0]
            self._samples.clear()
        self._samples.append((offset, error))
        del self._samples[:-SAMPLES]
        # Every sample's bounds hold the true offset, so where they all overlap
        # does: truncated times read at different points of a second narrow each
        # other (etcd's whole-second Date alone leaves 0.5 s either way, and
        # replicas whose guesses sat up to a second apart took over up to a
        # second late). Where the overlap is no narrower than the narrowest
        # sample (by more than float rounding at epoch magnitudes), or the bounds
        # do not overlap at all (a drift inside the jump slack): that sample.
        narrowest = min(self._samples, key=lambda s: s[1])
        low = max(m - e for m, e in self._samples)
        high = min(m + e for m, e in self._samples)
        overlap = ((low + high) / 2, (high - low) / 2)
        self._best = overlap if 0 <= overlap[1] < narrowest[1] - 1e-6 else narrowest

    @property
    def measured(self) -> bool:
        """Whether the store's time was sampled at least once."""
        return self._best is not None

    @property
    def offset(self) -> float | None:
        """The store's wall time minus this host's, in seconds; ``None`` before a sample."""
        best = self._best
        return None if best is None else best[0] + self.local.monotonic() - self.local.time()

    @property
    def error(self) -> float | None:
        """How far :attr:`offset` may be off, in seconds; ``None`` before a sample."""
        best = self._best
        return None if best is None else best[1]

    def monotonic(self) -> float:
        """The local clock's."""
        return self.local.monotonic()

    def time(self) -> float:
        """The store's wall-clock seconds since the epoch; the local ones before a sample."""
        best = self._best
        return self.local.time() if best is None else self.local.monotonic() + best[0]

    def wait(self, timeout: float, *events: threading.Event) -> bool:
        """The local clock's."""
        return self.local.wait(timeout, *events)
