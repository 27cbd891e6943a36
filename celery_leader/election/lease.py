"""A lease: an elector, its members, and what watches it for the log."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..backends import HolderInfo, Journal, LeaseLock
from ..backends.urls import mask_url
from ..clock import SYSTEM_CLOCK, Clock, StoreClock
from ..exceptions import StoreUnavailable
from ..settings.config import LeaderConfig, validate_name
from .elector import Elector
from .events import NO_CALLBACKS, Callbacks, Events, LeaseArg, Observer
from .foreign import ForeignWatch
from .history import TermHistory
from .members import Member, Members
from .skew import SkewWatch

logger = logging.getLogger(__name__)


class Lease(Elector):
    """Membership of one instance in one election.

    ``callbacks``, ``observers``, ``health_check`` and ``on_cycle`` are its first member.
    A local clock more than ``max_clock_skew`` off :attr:`store_clock` is logged; with
    ``clock_source="local"`` the lease gives up its terms until it is back.
    With a ``journal``, its terms are written to the term history.
    """

    def __init__(
        self,
        election: str,
        lock: LeaseLock,
        *,
        ttl: float,
        renew_interval: float,
        instance_id: str,
        callbacks: Callbacks = NO_CALLBACKS,
        observers: Iterable[Observer] = (),
        health_check: Callable[[], str | None] | None = None,
        on_cycle: Callable[[Lease], Any] | None = None,
        deployment: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        max_clock_skew: float | None = None,
        clock_source: str = "store",
        journal: Journal | None = None,
    ) -> None:
        validate_name("election", election)
        #: Who hears of its terms.
        self.members = Members()
        watching = tuple(observers)
        if callbacks is not NO_CALLBACKS or watching or health_check or on_cycle:
            own = Member(callbacks, None, health_check, on_cycle, watching, pairs_refusal=False)
            self.members.add(own)
        #: The store's clock as this lease measured it (the local one until a
        #: sample, and for stores without a clock of its own).
        self.store_clock = StoreClock(clock)
        url = mask_url(lock.url)
        resolution = lock.clock_resolution
        self._skew = SkewWatch(self.store_clock, url, resolution, max_clock_skew, clock_source)
        self._outage = StoreOutage(url)
        listeners: tuple[Events, ...] = (self._outage, self._skew, ForeignWatch(url), self.members)
        if journal is not None:
            history = TermHistory(journal, lock.timeout, self.store_clock.time)
            listeners = (*listeners, history)
        # A lease for members that come and go (a lease set's) asks them every
        # HEALTH_POLL: a member may bring a health check whenever it joins.
        polls = health_check is not None or not self.members
        super().__init__(
            election, lock, ttl, renew_interval, instance_id, deployment, clock, listeners, polls
        )

    @classmethod
    def from_config(
        cls, election: str, config: LeaderConfig, lock: LeaseLock, **options: Any
    ) -> Lease:
        """A lease with the ttl, renew interval, instance id, deployment and clock
        settings of ``config``; ``options`` are the constructor's others."""
        return cls(
            election,
            lock,
            ttl=config.ttl,
            renew_interval=config.renew_interval,
            instance_id=config.instance_id,
            deployment=config.deployment,
            max_clock_skew=config.max_clock_skew,
            clock_source=config.clock,
            **options,
        )

    @property
    def store_reachable(self) -> bool:
        """False after an acquire or renewal failed, until one succeeds again."""
        return self._outage.error is None

    @property
    def clock_problem(self) -> str | None:
        """Why this lease gives up terms it wins (its clock is off and schedules run
        on it, ``clock_source="local"``); ``None`` when it campaigns."""
        return self._skew.clock_problem

    def holder(self) -> HolderInfo | None:
        """Ask the store who holds the election now (one round trip)."""
        return self.store_lock.holder(self.election)


class StoreOutage(Events):
    """One warning when acquires or renewals stop reaching the store (not one per
    retry), and a note when they reach it again."""

    def __init__(self, url: str) -> None:
        self._url = url  # masked
        #: Why the last acquire or renewal failed; ``None`` once one succeeded.
        self.error: str | None = None

    def on_store_call(
        self, lease: LeaseArg, operation: str, seconds: float, error: BaseException | None
    ) -> None:
        if operation not in ("acquire", "renew"):
            return  # a release, or a scheduler's call: reported where it is made
        if error is None:
            if self.error is not None:
                what = "celery-leader: store %s answers again for %r"
                logger.info(what, self._url, lease.election)
            self.error = None
        elif isinstance(error, StoreUnavailable):
            if str(error) != self.error:
                msg = (
                    "celery-leader: store %s unreachable or refusing for %r: %s "
                    "(retrying; nobody can lead through it until it answers)"
                )
                logger.warning(msg, self._url, lease.election, error)
            self.error = str(error)
