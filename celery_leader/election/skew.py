"""The store's clock as a lease measures it, and what a lease does when this host's is off."""

from __future__ import annotations

import logging

from ..clock import StoreClock
from .events import Events, LeaseArg

logger = logging.getLogger(__name__)


class SkewWatch(Events):
    """Samples the store's clock from every answered acquire and renewal; logs a jump of it,
    and this host's clock crossing ``max_skew`` off it (once per crossing). With
    ``source="local"`` the lease gives up any term it wins or renews while that far off."""

    def __init__(
        self,
        store_clock: StoreClock,
        url: str,
        resolution: float | None,
        max_skew: float | None,
        source: str,
    ) -> None:
        self.store_clock = store_clock
        self._url = url  # masked
        self._resolution = resolution  # None: the store has no clock of its own
        self._max_skew = max_skew
        self._source = source
        self._skewed = False  # the local clock is off by more than max_skew
        self._jumps_seen = 0

    @property
    def clock_problem(self) -> str | None:
        """Why the lease gives up the terms it wins; ``None`` when it campaigns."""
        if not self._skewed or self._source != "local":
            return None
        return (
            f"this host's clock is {-(self.store_clock.offset or 0.0):+.1f} s off the store's, "
            f"more than leader_max_clock_skew ({self._max_skew:g} s), and "
            'leader_clock is "local": it does not lead until its clock is fixed'
        )

    def on_answer(self, lease: LeaseArg, sent: float, store_time: float | None) -> None:
        if store_time is not None and self._resolution is not None:
            self._sample(lease, store_time, sent, self._resolution)
        problem = self.clock_problem
        if problem is not None:
            # A term just won was never believed; one renewed is believed no more.
            lease.step_down(problem, kind="clock_skew", sit_out=lease.renew_interval)

    def _sample(self, lease: LeaseArg, store_time: float, sent: float, resolution: float) -> None:
        clock = self.store_clock
        clock.sample(store_time, sent, lease.clock.monotonic(), resolution)
        if clock.jumps != self._jumps_seen:
            self._jumps_seen = clock.jumps
            # Only schedules on the store's clock follow the jump; naming the clock
            # they run on tells an operator whether slots can stall or be missed.
            follows = (
                "now runs on the new one; slots already sent are not sent again"
                if self._source == "store"
                else 'schedules on this host\'s clock (leader_clock "local")'
            )
            msg = (
                "celery-leader: the clock of store %s jumped %+.1f s (a fail-over to a server "
                "whose clock differs?): %r %s"
            )
            logger.warning(msg, self._url, clock.last_jump, lease.election, follows)
        offset, error = clock.offset, clock.error
        if self._max_skew is None or offset is None or error is None:
            return
        # Only what the error bound cannot explain counts.
        skewed = abs(offset) - error > self._max_skew
        if skewed == self._skewed:
            return
        self._skewed = skewed
        if skewed:
            msg = (
                "celery-leader: this host's clock is %+.1f s off the clock of store %s "
                "(within %.3f s), more than leader_max_clock_skew (%g s)%s"
            )
            then = (
                ': leader_clock is "local", so it does not lead until its clock is fixed'
                if self._source == "local"
                else '; schedules run on the store\'s clock (leader_clock "store")'
            )
            logger.warning(msg, -offset, self._url, error, self._max_skew, then)
        else:
            msg = "celery-leader: this host's clock is back within %g s of the store's (%+.1f s)"
            logger.info(msg, self._max_skew, -offset)
