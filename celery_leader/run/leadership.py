"""Leader election for plain Python: code that must run in one process of many (see
docs/python-api.md)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..backends import HolderInfo
from ..election.events import Callbacks
from ..election.lease import Lease
from ..election.lease_set import Membership, lease_set
from ..settings.config import LeaderConfig

__all__ = ["LeaderLoop", "Leadership", "leader_loop"]

logger = logging.getLogger(__name__)


class Leadership:
    """This process's membership of ``election``; a context manager.

    ``config`` defaults to :meth:`LeaderConfig.from_env` (``CELERY_LEADER_*``
    environment variables). The callbacks run in the lease's thread and must
    return quickly; ``on_stopped`` runs before the term is released, so work
    stopped there is over before another process can start it. A callback that
    raises is logged; ``on_started`` raising makes this process step down.
    """

    def __init__(
        self,
        election: str,
        config: LeaderConfig | None = None,
        *,
        on_started: Callable[[int], Any] | None = None,
        on_stopped: Callable[[], Any] | None = None,
        on_new_leader: Callable[[HolderInfo], Any] | None = None,
    ) -> None:
        self.election = election
        self.config = LeaderConfig.from_env() if config is None else config
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._on_new_leader = on_new_leader
        self._membership: Membership | None = None
        self._changed = threading.Condition()
        self._started_epoch: int | None = None  # the term on_started was told of
        self._since: float | None = None
        self._holder: HolderInfo | None = None  # the last leader the lease told of

    def start(self) -> Leadership:
        """Join the election (campaign in the background); return ``self``. Idempotent."""
        if self._membership is None:
            self._membership = lease_set(self.config).join(
                self.election,
                callbacks=Callbacks(
                    on_started=self._started,
                    on_stopped=self._demoted,
                    on_new_leader=self._new_leader,
                ),
            )
        return self

    def stop(self) -> None:
        """Leave the election: stop leading (``on_stopped`` runs), then release the
        term so another process takes over at once. Idempotent."""
        membership, self._membership = self._membership, None
        if membership is not None:
            membership.leave()
            self._demoted()  # a lease shared with other members keeps running

    def __enter__(self) -> Leadership:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def is_leader(self) -> bool:
        """True while this process holds a valid term (checked against the clock)."""
        return self._lease is not None and self._lease.is_leader()

    @property
    def epoch(self) -> int | None:
        """The fencing token of this process's term while it leads, else ``None``."""
        return None if self._lease is None else self._lease.epoch

    @property
    def holder(self) -> HolderInfo | None:
        """The last leader seen (this process included), or ``None`` before any."""
        return self._holder

    @property
    def since(self) -> float | None:
        """``time.time()`` when this process started leading, while it leads."""
        return self._since if self.is_leader() else None

    def wait_until_leading(self, timeout: float | None = None) -> bool:
        """Block until this process leads or ``timeout`` seconds passed; True if it leads."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            # Leading once ``on_started`` returned: what it set up, and ``holder``, are ready.
            while self._started_epoch is None or not self.is_leader():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
        return True

    @property
    def _lease(self) -> Lease | None:
        membership = self._membership
        return None if membership is None else membership.lease

    def _started(self, lease: Lease) -> None:
        epoch = lease.epoch
        with self._changed:
            # Joining a lease that leads already runs this in the joining thread,
            # which may race the lease thread announcing the same term.
            if epoch is None or self._started_epoch == epoch:
                return
        if self._on_started is not None:
            self._on_started(epoch)  # raising makes the lease step down: not started
        with self._changed:
            self._started_epoch, self._since = epoch, lease.clock.time()
            # The lease tells on_new_leader of its own term just after this; until
            # then ``holder`` would still name the last leader.
            self._holder = HolderInfo(
                lease.instance_id, epoch, lease.ttl, lease.deployment, since=self._since
            )
            self._changed.notify_all()

    def _new_leader(self, lease: Lease, holder: HolderInfo) -> None:
        self._holder = holder
        if self._on_new_leader is not None:
            self._on_new_leader(holder)

    def _demoted(self, lease: Lease | None = None) -> None:
        with self._changed:
            was_leading, self._started_epoch = self._started_epoch is not None, None
            self._changed.notify_all()
        if was_leading and self._on_stopped is not None:
            try:
                self._on_stopped()
            except Exception:
                logger.exception("celery-leader: on_stopped of %r failed", self.election)


class LeaderLoop:
    """A function called every ``interval`` seconds with the epoch, only while leading.

    Calling the loop blocks until ``stop`` is set, then leaves the election.
    """

    def __init__(
        self,
        func: Callable[[int], Any],
        election: str,
        interval: float,
        config: LeaderConfig | None,
    ) -> None:
        self.func = func
        self.election = election
        self.interval = interval
        self.config = config

    def __call__(self, stop: threading.Event | None = None) -> None:
        stop = threading.Event() if stop is None else stop
        with Leadership(self.election, self.config) as leadership:
            while not stop.is_set():
                # Short waits, so a set ``stop`` is seen within a quarter second.
                if not leadership.wait_until_leading(timeout=0.25):
                    continue
                epoch = leadership.epoch
                if epoch is not None:
                    self.func(epoch)
                stop.wait(self.interval)


def leader_loop(
    election: str, *, interval: float, config: LeaderConfig | None = None
) -> Callable[[Callable[[int], Any]], LeaderLoop]:
    """Decorate ``func(epoch)`` as a :class:`LeaderLoop` of ``election``.

    ::

        @leader_loop("cleanup", interval=5.0)
        def cleanup(epoch: int) -> None:
            ...

        cleanup(stop_event)  # blocks; runs cleanup(epoch) every 5 s while leading
    """

    return lambda func: LeaderLoop(func, election, interval, config)
