"""``LeaderMiddleware``: its settings, and the parts it passes Dramatiq's hooks to.

Leases are released at the first SIGTERM or SIGHUP, in ``before_worker_shutdown``
and by a ``multiprocessing.util.Finalize``: ``atexit`` does not run in Dramatiq's
worker processes, and a second SIGTERM skips the shutdown hooks but not finalizers.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.util import Finalize
from typing import Any

from dramatiq.common import q_name
from dramatiq.middleware import Middleware
from dramatiq.worker import CONSUMER_RESTART_DELAY_SECS

from ..election import body_epoch
from ..election.events import Callbacks
from ..election.lease import Lease
from ..election.lease_set import LeaseSet, Membership, lease_set
from ..election.pins import role_of, watch
from ..exceptions import ConfigError, LeaderError
from ..probes import metrics
from ..probes.health import ConsumerLiveness, HealthFile
from ..probes.http import LeaderSeen, serve
from ..settings.config import LeaderConfig
from ..settings.process import after_fork_in_child, default_instance_id
from .actors import ActorRules, Gates, LeaderOnly
from .cli_errors import one_line_errors
from .ledger import LedgerStep
from .pika_logs import quiet_connect_errors
from .runner import embedded_scheduler
from .settings import load_config

logger = logging.getLogger(__name__)

# The middleware of this process, for is_leader() and current_epoch(), which
# take no broker: module-wide, as Dramatiq's own global broker is.
_current: LeaderMiddleware | None = None


def _to_parts(hook: str) -> Callable[..., None]:
    """Dramatiq's ``hook``, passed on in order to each part that has it (one that
    raises stops it). A part may lack a hook: the parts inherit Dramatiq's no-op
    hooks, and the oldest Dramatiq supported (1.15) has no ``after_consumer_thread_boot``."""

    def to_parts(self: LeaderMiddleware, *args: Any, **kwargs: Any) -> None:
        for part in self.parts:
            method = getattr(part, hook, None)
            if method is not None:
                method(*args, **kwargs)

    to_parts.__name__ = to_parts.__qualname__ = hook
    return to_parts


class LeaderMiddleware(Middleware):
    """Leader election for Dramatiq: ``leader_schedule``, ``leader_only``, ``leader_on_follower``;
    arguments not given are read from ``CELERY_LEADER_*``."""

    @one_line_errors
    def __init__(
        self,
        *,
        url: str | None = None,
        ttl: float | None = None,
        renew_interval: float | None = None,
        key_prefix: str | None = None,
        instance_id: str | None = None,
        beat_election: str | None = None,
        worker_election: str | None = None,
        scheduler: bool = False,
    ) -> None:
        global _current
        given = dict(url=url, ttl=ttl, renew_interval=renew_interval, key_prefix=key_prefix)
        given.update(instance_id=instance_id, beat_election=beat_election)
        self.config = load_config({**given, "worker_election": worker_election})
        if not isinstance(scheduler, bool):
            raise ConfigError(f"scheduler= must be True or False (got {scheduler!r})")
        self.scheduler = scheduler
        # The default id names the process; recomputed per process (forks).
        self._pid_instance = self.config.instance_id == default_instance_id()
        rules = ActorRules(self.config.worker_election)
        reach = BrokerReach(rules)
        # The gates ask the campaign who leads; the campaign tells them of each change.
        self.gates = Gates(rules, lambda election: self.campaign.epoch(election) is not None)
        self.campaign = Campaign(self, rules, self.gates, reach)
        check = LeaderOnly(rules, self.campaign.epoch, self.gates)
        #: Dramatiq's hooks go to each of these in turn.
        self.parts: list[Middleware] = [rules, reach, self.gates, self.campaign, check]
        if self.config.ledger:
            self.parts.append(LedgerStep(self.config))
        _current = self

    @property
    def actor_options(self) -> set[str]:
        """Actor options this middleware reads."""
        return {"leader_schedule", "leader_only", "leader_on_follower"}

    @property
    def forks(self) -> list[Callable[[], int]]:
        """With ``scheduler=True``, ``dramatiq`` runs the scheduler in a fork process."""
        return [embedded_scheduler] if self.scheduler else []

    def process_config(self) -> LeaderConfig:
        """The settings of this process: the default instance id names this pid."""
        if self._pid_instance:
            return dataclasses.replace(self.config, instance_id=default_instance_id())
        return self.config

    before_declare_actor = _to_parts("before_declare_actor")
    after_process_boot = _to_parts("after_process_boot")
    after_consumer_thread_boot = _to_parts("after_consumer_thread_boot")
    after_worker_boot = _to_parts("after_worker_boot")
    before_worker_shutdown = _to_parts("before_worker_shutdown")
    before_process_message = _to_parts("before_process_message")
    # Dramatiq calls every middleware's after hooks, whatever another raised.
    after_process_message = _to_parts("after_process_message")
    after_skip_message = _to_parts("after_skip_message")


class Campaign(Middleware):
    """Joins this worker process's elections at boot, leaves them at shutdown, signal or exit."""

    def __init__(
        self, settings: LeaderMiddleware, rules: ActorRules, gates: Gates, reach: BrokerReach
    ) -> None:
        self._settings = settings
        self._rules = rules
        self._gates = gates  # told of every change of leadership
        self._reach = reach  # a process cut off from the broker must not lead
        self._booted = False  # a Worker of this process booted
        self._forget_parent()
        after_fork_in_child(self._forget_parent)

    def _forget_parent(self) -> None:
        # Also in a forked child: a parent's thread may have held the locks at the fork.
        self._lock = threading.Lock()
        self._stop_lock = threading.Lock()  # a second stop() waits for the first one
        self._leases: LeaseSet | None = None  # this process's, once it used the store
        self._memberships: dict[str, Membership] = {}  # election -> this campaign's share
        #: stop() ran: never join an election again in this process.
        self.closed = False
        self._campaigns: set[str] = set()  # elections this worker process consumes work of

    def after_process_boot(self, broker: Any) -> None:
        """Release at the first SIGTERM or SIGHUP, before Dramatiq's handler: its worker
        process notices a SIGTERM only at its next one-second poll, and a relayed copy of a
        group-wide signal often merges with it."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.getsignal(sig)
            if callable(previous):
                signal.signal(sig, self._releasing(previous))

    def _releasing(self, previous: Callable[[int, Any], Any]) -> Callable[[int, Any], Any]:
        def handler(signum: int, frame: Any) -> Any:
            # The release talks to the store: not in a signal handler.
            threading.Thread(target=self.stop, name="celery-leader:release", daemon=True).start()
            return previous(signum, frame)

        return handler

    @one_line_errors
    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        """Campaign in the elections of the leader-only actors this process consumes."""
        if self._booted:
            # An earlier Worker of this process stopped (only tests start one
            # after another): this one may lead again. A process whose first
            # worker boots after a SIGTERM stays closed.
            with self._lock:
                self.closed = False
        self._booted = True
        with self._lock:
            self._campaigns = self._rules.elections(worker.consumers)
        for election in sorted(self._campaigns):
            self.lease(election)
        self._gates.update_all()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        """Hand over at once, before in-flight messages finish."""
        self.stop()

    def epoch(self, election: str) -> int | None:
        """The epoch this process leads ``election`` under now, else ``None``: a test's pin,
        else its own lease."""
        pin = role_of(election)
        if pin is not None:
            return pin.epoch
        membership = self._memberships.get(election)
        return None if self.closed or membership is None else membership.lease.epoch

    def lease(self, election: str | None = None) -> Lease:
        """This process's lease of ``election`` (default: the worker election), started on
        first use; only for an election this process campaigns in."""
        election = election or self._rules.worker_election
        with self._lock:
            if self.closed:
                raise LeaderError("LeaderMiddleware stopped: this process is shutting down")
            if election not in self._campaigns:
                raise LeaderError(f"this process does not campaign in {election!r}")
            membership = self._memberships.get(election)
            if membership is None:
                # With scheduler=True, the scheduler's fork process serves the port.
                port = None if self._settings.scheduler else self._settings.config.health_port
                probe = None if port is None else ElectionProbe(port)
                if self._leases is None:  # this process's leases and store connection
                    self._leases = lease_set(self._settings.process_config())
                    Finalize(self, self.stop, exitpriority=100)
                membership = self._memberships[election] = self._leases.join(
                    election,
                    callbacks=None if probe is None else probe.callbacks,
                    on_change=lambda lease: self._gates.update(lease.election),
                    health_check=lambda: self._reach.problem(election),
                    on_cycle=None if probe is None else probe.cycle,
                    observers=(metrics.OBSERVER,),
                    start=False,
                )
                if probe is not None:
                    # Before the lease starts, so its first cycle finds the record.
                    probe.offer(membership.lease)
                membership.lease.start()
        return membership.lease

    def campaigns(self, election: str | None = None) -> bool:
        """Whether this process campaigns in ``election``: a worker consuming its actors."""
        with self._lock:
            return (election or self._rules.worker_election) in self._campaigns

    def stop(self) -> None:
        """Leave every election of this process; racing callers wait for the first release."""
        with self._stop_lock:
            with self._lock:
                self.closed = True
                leases, self._leases = self._leases, None
                memberships, self._memberships = list(self._memberships.values()), {}
            if leases is None:
                return
            # Before the demotion below settles them (see Gate.shut_down).
            self._gates.shut_down()
            # Leaving the set's last lease closes its store connection.
            for membership in memberships:
                membership.leave()


class BrokerReach(Middleware):
    """Whether this process reaches the broker (one cut off must not lead): a delay queue
    consumer calls ``handle_delayed_messages`` after every message and idle poll, unless its
    connection failed and it sits in the restart delay."""

    def __init__(self, rules: ActorRules) -> None:
        self._rules = rules
        self._forget_parent()
        after_fork_in_child(self._forget_parent)

    def _forget_parent(self) -> None:
        # Also in a forked child: none of its parent's consumer threads run there.
        self._lock = threading.Lock()
        self._liveness: dict[str, list[ConsumerLiveness]] = {}  # election -> its consumers'

    def after_process_boot(self, broker: Any) -> None:
        """pika's failed connection attempts are said once, by whoever catches the error."""
        quiet_connect_errors(broker)

    def after_consumer_thread_boot(self, broker: Any, thread: Any) -> None:
        """Watch the consumer of a leader-only queue's delay queue."""
        queue = thread.queue_name
        election = self._rules.of_queue(queue).election
        if election is None or queue == q_name(queue):
            return
        grace = CONSUMER_RESTART_DELAY_SECS + 2 * thread.worker_timeout / 1000
        found = ConsumerLiveness(f"consumer of {queue!r}", grace)
        original = thread.handle_delayed_messages

        def handle_delayed_messages() -> None:
            found.alive()
            original()

        thread.handle_delayed_messages = handle_delayed_messages
        with self._lock:
            self._liveness.setdefault(election, []).append(found)

    def problem(self, election: str) -> str | None:
        """Why this process must not lead ``election``: its consumers cannot reach the broker."""
        consumers = list(self._liveness.get(election, []))
        return next(filter(None, (consumer.problem() for consumer in consumers)), None)


# Ports another process of this node serves: said once per port, not per
# election, whichever middleware of this process asks.
_taken: set[int] = set()


class ElectionProbe:
    """One election's record for ``leader_health_port``, offered once its lease exists: the
    first worker process that campaigns serves the port, the others skip (``SO_REUSEPORT``
    would answer each probe from whichever process the kernel picks)."""

    def __init__(self, port: int) -> None:
        self.port = port
        #: Who this process last saw lead, for ``/leader``.
        self.seen = LeaderSeen()
        #: For the join: ``on_new_leader`` feeds :attr:`seen`.
        self.callbacks = Callbacks(on_new_leader=self.seen)
        self._health: HealthFile | None = None

    def cycle(self, lease: Lease) -> None:
        """After every acquire or renew cycle: refresh the record ``/healthz`` judges
        (a lease thread that stops cycling leaves it stale: 503)."""
        if self._health is not None:
            self._health.write(force=False)

    def offer(self, lease: Lease) -> None:
        """Serve ``lease``'s record on the port unless another process of this node does;
        :class:`~celery_leader.exceptions.ConfigError` when it cannot bind for another reason."""
        self._health = HealthFile(None, lease)
        if self.port in _taken:
            return
        try:
            serve(self.port, self._health, self.seen)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise ConfigError(f"leader_health_port {self.port}: cannot listen: {exc}") from None
            _taken.add(self.port)
            msg = (
                "celery-leader: leader_health_port %d is taken (another worker process of "
                "this node serves it); process %d does not serve it"
            )
            logger.debug(msg, self.port, os.getpid())
            return
        msg = "celery-leader: process %d serves leader_health_port %d for %r"
        logger.info(msg, os.getpid(), self.port, lease.election)


def is_leader(election: str | None = None) -> bool:
    """Whether this process leads ``election`` now (default: the worker election).

    Never joins nor talks to the store: a test's pin answers, else a lease this process holds.
    """
    election = election or _middleware().config.worker_election
    pin = role_of(election)
    if pin is not None:
        return pin.leads
    lease = _held(election)
    return lease is not None and lease.is_leader()


def current_epoch(election: str | None = None) -> int | None:
    """The fencing token of this process's current term of ``election``, else ``None``.

    In a ``leader_only`` actor, the epoch its message was let through with, for the whole body.
    """
    election = election or _middleware().config.worker_election
    passed = body_epoch.of(election)
    if passed is not None:
        return passed
    pin = role_of(election)
    if pin is not None:
        return pin.epoch
    lease = _held(election)
    return None if lease is None else lease.epoch


def _held(election: str) -> Lease | None:
    """The lease of ``election`` a part of this process joined, if any (no join, no I/O)."""
    return lease_set(_middleware().process_config()).lease_of(election)


def _on_pins_changed() -> None:
    # A stopped middleware's worker is gone (or stopping): nothing to pause.
    if _current is not None and not _current.campaign.closed:
        _current.gates.update_all()


watch(_on_pins_changed)


def _middleware() -> LeaderMiddleware:
    if _current is None:
        raise ConfigError("no LeaderMiddleware in this process: add one to the broker")
    return _current
