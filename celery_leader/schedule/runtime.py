"""A scheduler's lease and what watches it (tick watchdog, health file and endpoint, metrics
endpoint), built the same way for Celery beat and the Dramatiq scheduler."""

from __future__ import annotations

from collections.abc import Iterable

from ..backends import StoreFacets
from ..election.events import Callbacks, Observer
from ..election.lease import Lease
from ..election.lease_set import Membership, lease_set
from ..probes import http as http_health
from ..probes import metrics
from ..probes.health import HealthFile, Watchdog
from ..settings.config import LeaderConfig


class SchedulerRuntime:
    """The scheduler election's lease, joined on first use (Celery builds a scheduler just to
    print the banner, which must not join), with its watchdog and probes."""

    def __init__(self, config: LeaderConfig, observers: Iterable[Observer] = ()) -> None:
        self.config = config
        self.observers = tuple(observers)
        if config.metrics_port is not None:
            metrics.require()  # a missing [metrics] extra fails at start-up
        self.watchdog = Watchdog(config.watchdog_timeout)
        self._membership: Membership | None = None
        self._health: HealthFile | None = None

    @property
    def joined(self) -> bool:
        """Whether the lease was created (and so runs until :meth:`close`)."""
        return self._membership is not None

    @property
    def lease(self) -> Lease:
        """The election's lease; the first use starts it."""
        if self._membership is None:
            config = self.config
            if config.metrics_port is not None:
                metrics.serve(config.metrics_port)
            port = config.health_port
            health_record = config.health_file is not None or port is not None
            seen = None if port is None else http_health.LeaderSeen()
            # A tick that overruns leader_tick_timeout makes the lease hand over.
            membership = lease_set(config).join(
                config.beat_election,
                callbacks=None if seen is None else Callbacks(on_new_leader=seen),
                health_check=self.watchdog.overdue,
                on_cycle=self._lease_cycle if health_record else None,
                observers=self.observers,
                start=False,
            )
            lease = membership.lease
            if health_record:
                self._health = HealthFile(config.health_file, lease, self.watchdog)
            if port is not None and seen is not None and self._health is not None:
                http_health.serve(port, self._health, seen)
            metrics.track(lease)
            self._membership = membership
            lease.start()
        return self._membership.lease

    @property
    def store(self) -> StoreFacets:
        """The store the lease campaigns in: the facets the scheduler writes through."""
        return lease_set(self.config).store

    def _lease_cycle(self, lease: Lease) -> None:
        self.write_health()

    def write_health(self) -> None:
        """Rewrite the health record, if there is one (rate-limited)."""
        if self._health is not None:
            self._health.write(force=False)

    def close(self) -> None:
        """Hand over (demote, release, wake a follower), then close the store. Idempotent."""
        membership, self._membership = self._membership, None
        if membership is not None:
            membership.leave()
