"""``LeaderMiddleware``: settings, leader-only actors and the embedded scheduler.

Every Dramatiq process that builds the broker gets its own middleware instance.
Only worker processes that consume a leader-only actor's queue campaign, each
with its own lease (instance id ``host:pid``); the scheduler campaigns in its
own election. :func:`is_leader` never joins: in any other process (a web server)
it answers "not leading".
Leases are released at the first SIGTERM or SIGHUP, in ``before_worker_shutdown``
and, because ``atexit`` does not run in Dramatiq's worker processes, by a
``multiprocessing.util.Finalize`` too: a second SIGTERM (Dramatiq's main process
relays the one systemd sends to the whole group) skips the shutdown hooks but
not the finalizers.
With ``leader_health_port`` set, the first worker process that campaigns serves
it and the others skip it (:mod:`celery_leader.dramatiq.health_port`); with
``scheduler=True`` the scheduler's fork process serves it instead.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.util import Finalize
from typing import Any

from .. import body_epoch, metrics
from ..config import LeaderConfig, validate_name
from ..election.lease import Lease
from ..election.lease_set import LeaseSet, Membership, lease_set
from ..exceptions import ConfigError, LeaderError, missing_extra
from ..health import ConsumerLiveness
from ..pins import Role, role_of, watch
from ..process import after_fork_in_child, default_instance_id
from .cli_errors import one_line_errors
from .gate import Gate, liveness
from .health_port import ElectionProbe
from .ledger import LedgerStep
from .pika_logs import quiet_connect_errors
from .runner import embedded_scheduler
from .scheduler import schedules_of
from .settings import load_config

try:
    from dramatiq.common import q_name
    from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage
    from dramatiq.worker import CONSUMER_RESTART_DELAY_SECS
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "dramatiq") from None

logger = logging.getLogger(__name__)

#: What a follower does with a leader-only actor's message.
MODES = ("skip", "wait")

#: Longest wait for a consumer to pause when a test pins a follower: its idle
#: timeout plus Dramatiq's restart delay (3 s unless ``dramatiq_restart_delay``).
PAUSE_TIMEOUT = 10.0

#: The middleware of this process, for :func:`is_leader` and :func:`current_epoch`.
_current: LeaderMiddleware | None = None


class LeaderActorError(ConfigError, MiddlewareError):
    """A leader option of an actor is invalid.

    A ``MiddlewareError``, because Dramatiq logs and ignores any other error a
    middleware raises while an actor is declared, and the import must fail.
    """


@dataclass(frozen=True)
class Rule:
    """How a queue's actors run: ``election`` ``None`` for ordinary actors."""

    election: str | None
    mode: str = "wait"


class LeaderMiddleware(Middleware):
    """Leader election for Dramatiq: ``leader_schedule``, ``leader_only``, ``leader_on_follower``.

    Arguments not given are read from ``CELERY_LEADER_*`` (Django settings
    under django_dramatiq, else the environment). ``scheduler=True`` runs the
    scheduler in a fork process of ``dramatiq``; without it, run
    ``python -m celery_leader.dramatiq MODULE`` beside the workers.
    """

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
        self.config = load_config(
            {
                "url": url,
                "ttl": ttl,
                "renew_interval": renew_interval,
                "key_prefix": key_prefix,
                "instance_id": instance_id,
                "beat_election": beat_election,
                "worker_election": worker_election,
            }
        )
        if not isinstance(scheduler, bool):
            raise ConfigError(f"scheduler= must be True or False (got {scheduler!r})")
        self.scheduler = scheduler
        # The default id names the process; recomputed per process (forks).
        self._pid_instance = self.config.instance_id == default_instance_id()
        self._rules: dict[str, Rule] = {}  # actor name -> rule
        self._queues: dict[str, tuple[Rule, str]] = {}  # queue -> rule, an actor showing it
        self._entries: dict[str, str] = {}  # schedule entry name -> its actor
        self._lock = threading.Lock()
        self._stop_lock = threading.Lock()  # a second stop() waits for the first one
        self._booted = False  # a Worker of this process booted
        self._leases: LeaseSet | None = None  # this process's, once it used the store
        self._memberships: dict[str, Membership] = {}  # election -> this middleware's share
        self._closed = False  # stop() ran: never join an election again in this process
        self._campaigns: set[str] = set()  # elections this worker process consumes work of
        self._gates: dict[str, Gate] = {}  # wait-mode queue -> its consumer's gate
        self._liveness: dict[str, list[ConsumerLiveness]] = {}  # election -> its queues' consumers
        #: Run-ledger hooks (``leader_ledger``); ``None`` with the ledger off.
        self._ledger = LedgerStep(self.config) if self.config.ledger else None
        after_fork_in_child(self._forget_parent)
        _current = self

    # -- Dramatiq's middleware interface -------------------------------------

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

    @one_line_errors
    def before_declare_actor(self, broker: Any, actor: Any) -> None:
        """Check the actor's leader options; a bad one fails the import."""
        try:
            rule = self._rule_of(actor)
        except ConfigError as exc:
            raise LeaderActorError(f"actor {actor.actor_name!r}: {exc}") from None
        queue = actor.queue_name
        known = self._queues.get(queue)
        if known is not None and known[0] != rule and known[1] != actor.actor_name:
            raise LeaderActorError(
                f"queue {queue!r} mixes actor {actor.actor_name!r} ({_describe(rule)}) with "
                f"{known[1]!r} ({_describe(known[0])}): put leader-only actors on a queue of "
                "their own (queue_name=)"
            )
        for name in _entry_names(actor):
            owner = self._entries.setdefault(name, actor.actor_name)
            if owner != actor.actor_name:
                raise LeaderActorError(
                    f"actor {actor.actor_name!r}: a leader_schedule entry of actor {owner!r} "
                    f"is named {name!r} too: give one of them name="
                )
        self._queues[queue] = (rule, actor.actor_name)
        if rule.election is None:
            self._rules.pop(actor.actor_name, None)
        else:
            self._rules[actor.actor_name] = rule

    def after_process_boot(self, broker: Any) -> None:
        """Quiet pika's connection errors; release at the first SIGTERM or SIGHUP.

        The release runs before Dramatiq's own handler, because Dramatiq's worker
        process only notices a SIGTERM at its next one-second poll; and when the
        signal reaches the whole group, Dramatiq's relayed copy often merges with
        it, so no second signal hurries it along.
        """
        quiet_connect_errors(broker)
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

    def after_consumer_thread_boot(self, broker: Any, thread: Any) -> None:
        """Gate a wait-mode queue's consumer; watch the delay queue's consumer of a leader-only one.

        Runs in the consumer thread before it first consumes, so no message gets past.
        """
        queue = thread.queue_name
        rule = self._queues.get(q_name(queue), (Rule(None), ""))[0]
        if rule.election is None:
            return
        if queue != q_name(queue):
            # The delay queue's consumer runs on every process, leader or not:
            # its silence means this process cannot reach the broker.
            grace = CONSUMER_RESTART_DELAY_SECS + 2 * thread.worker_timeout / 1000
            with self._lock:
                self._liveness.setdefault(rule.election, []).append(liveness(thread, grace))
        elif rule.mode == "wait":
            election = rule.election
            self._gates[queue] = Gate(thread, election, lambda: self.leads(election))

    @one_line_errors
    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        """Campaign in the elections of the leader-only actors this process consumes."""
        if self._booted:
            # An earlier Worker of this process stopped (only tests start one
            # after another): this one may lead again. A process whose first
            # worker boots after a SIGTERM stays closed.
            with self._lock:
                self._closed = False
        self._booted = True
        consumed = {q_name(queue) for queue in worker.consumers}
        with self._lock:
            self._campaigns = {
                rule.election
                for queue, (rule, _) in self._queues.items()
                if rule.election is not None and queue in consumed
            }
        for election in sorted(self._campaigns):
            self.lease(election)
        self._apply_all()
        if self._ledger is not None:
            self._ledger.register()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        """Hand over at once, before in-flight messages finish."""
        self.stop()

    def before_process_message(self, broker: Any, message: Any) -> None:
        """The leader-only gate, then (with ``leader_ledger``) the run ledger's record."""
        self._leader_gate(message)
        if self._ledger is not None:
            self._ledger.before(message)

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        """Record how a slot's actor ended (with ``leader_ledger``); the body's epoch ends."""
        # Dramatiq calls every middleware's after hook, whatever another raised.
        body_epoch.only(None)
        if self._ledger is not None:
            self._ledger.after(message, exception)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        """Another middleware skipped a slot this one recorded started: leave it to a retry."""
        body_epoch.only(None)
        if self._ledger is not None:
            self._ledger.after(message, SkipMessage())

    def _leader_gate(self, message: Any) -> None:
        """Let a leader-only actor's message through only on the leading process.

        Fails closed: any error here skips the message, because Dramatiq runs
        the actor when a middleware raises anything but a ``MiddlewareError``.
        A message let through runs with the epoch the check read: the lease
        may end before the actor's first line (a resign), and
        :func:`current_epoch` in the actor still answers the epoch it passed
        with (:mod:`celery_leader.body_epoch`).
        """
        try:
            rule = self._rules.get(message.actor_name)
            if rule is None or rule.election is None:
                return
            try:
                epoch = self.epoch(rule.election)
                if epoch is not None:
                    body_epoch.only(rule.election, epoch)
                    return
            except Exception:
                logger.exception(
                    "celery-leader: leadership check of %r failed; not running %s",
                    rule.election,
                    message.actor_name,
                )
            gate = self._gates.get(message.queue_name)
            if gate is not None:
                gate.hold(message)
            else:
                logger.info(
                    "celery-leader: skipping %s (%s): this process does not lead %r",
                    message.actor_name,
                    message.message_id,
                    rule.election,
                )
        except MiddlewareError:
            raise
        except BaseException:
            logger.exception("celery-leader: error in the leader check; skipping the message")
        raise SkipMessage(f"not the leader of a leader-only actor: {message.actor_name}")

    # -- leases -------------------------------------------------------------

    def leads(self, election: str) -> bool:
        """Whether this process leads ``election`` now: a test's pin, else its own lease."""
        pin = role_of(election)
        if pin is not None:
            return pin.leads
        membership = self._memberships.get(election)
        return not self._closed and membership is not None and membership.lease.is_leader()

    def epoch(self, election: str) -> int | None:
        """The epoch this process leads ``election`` under now, else ``None`` (as :meth:`leads`)."""
        pin = role_of(election)
        if pin is not None:
            return pin.epoch
        membership = self._memberships.get(election)
        return None if self._closed or membership is None else membership.lease.epoch

    def lease(self, election: str | None = None) -> Lease:
        """This process's lease of ``election`` (default: the worker election).

        Only for an election this worker process campaigns in (see
        :meth:`campaigns`); the lease starts on first use.
        """
        election = election or self.config.worker_election
        with self._lock:
            if self._closed:
                raise LeaderError("LeaderMiddleware stopped: this process is shutting down")
            if election not in self._campaigns:
                raise LeaderError(f"this process does not campaign in {election!r}")
            membership = self._memberships.get(election)
            if membership is None:
                probe = self._probe()
                membership = self._memberships[election] = self._lease_set().join(
                    election,
                    callbacks=None if probe is None else probe.callbacks,
                    on_change=self._apply,
                    health_check=lambda: self._cut_off(election),
                    on_cycle=None if probe is None else probe.cycle,
                    observers=(metrics.OBSERVER,),
                    start=False,
                )
                if probe is not None:
                    # Before the lease starts, so its first cycle finds the record.
                    probe.offer(membership.lease)
                membership.lease.start()
        return membership.lease

    def _probe(self) -> ElectionProbe | None:
        """A record for ``leader_health_port``, if this worker process may serve it.

        With ``scheduler=True`` the scheduler's fork process serves the port:
        the scheduler's tick is what a probe must watch, and two processes
        cannot listen on one port.
        """
        port = self.config.health_port
        return None if port is None or self.scheduler else ElectionProbe(port)

    def campaigns(self, election: str | None = None) -> bool:
        """Whether this process campaigns in ``election``: a worker consuming its actors."""
        with self._lock:
            return (election or self.config.worker_election) in self._campaigns

    def _forget_parent(self) -> None:
        """In a process forked from the one that built the middleware, start afresh
        (a parent's thread may have held the locks at the fork)."""
        self._lock, self._stop_lock = threading.Lock(), threading.Lock()
        self._leases, self._memberships = None, {}
        self._campaigns, self._gates, self._liveness = set(), {}, {}
        self._closed = False

    def _lease_set(self) -> LeaseSet:
        """This process's leases and store connection (call with ``_lock`` held)."""
        if self._leases is None:
            self._leases = lease_set(self.process_config())
            Finalize(self, self.stop, exitpriority=100)
        return self._leases

    def _cut_off(self, election: str) -> str | None:
        """Why this process must not lead ``election``: its consumers cannot reach the broker."""
        for consumer in list(self._liveness.get(election, [])):
            problem = consumer.problem()
            if problem is not None:
                return problem
        return None

    def stop(self) -> None:
        """Leave every election of this process (demote, release, wake a follower).

        Callers racing it (a signal's release thread, the shutdown hook, the
        finalizer at exit) wait until the first one has released.
        """
        with self._stop_lock:
            with self._lock:
                self._closed = True
                leases, self._leases = self._leases, None
                memberships, self._memberships = list(self._memberships.values()), {}
            if leases is None:
                return
            # Before the demotion below settles them: a stopping process's gated
            # consumers end their loops rather than pause (see Gate.shut_down).
            for gate in list(self._gates.values()):
                gate.shut_down()
            # Leaving the set's last lease closes its store connection.
            for membership in memberships:
                membership.leave()

    def _apply(self, lease: Lease) -> None:
        """Leadership of ``lease`` changed: open or close the gates of its wait-mode queues."""
        for gate in list(self._gates.values()):
            if gate.election == lease.election:
                gate.update()

    def _apply_all(self) -> None:
        """Open or close every gate to match who leads (a test's pin, else the lease).

        Returns once each consumer a pin made a follower has paused, so that a
        message the test sends next stays in the queue: a consumer that took it
        would hold it, and ``StubBroker`` cannot take a held message back.
        """
        for gate in list(self._gates.values()):
            gate.update()
            pin = role_of(gate.election)
            if pin is not None and not pin.leads and gate.thread.is_alive():
                gate.thread.paused_event.wait(PAUSE_TIMEOUT)

    def _rule_of(self, actor: Any) -> Rule:
        options = actor.options
        names = _entry_names(actor)
        if len(set(names)) != len(names):
            raise ConfigError("two leader_schedule entries share a name: give them name=")
        only = options.get("leader_only", False)
        mode = options.get("leader_on_follower")
        if only is True:
            election: str | None = self.config.worker_election
        elif only is False or only is None:
            election = None
        elif isinstance(only, str):
            election = validate_name("leader_only", only)
        else:
            raise ConfigError(f"leader_only must be True, False or an election name (got {only!r})")
        if mode is None:
            mode = "wait"
        elif election is None:
            raise ConfigError("leader_on_follower needs leader_only=True (or an election name)")
        if mode not in MODES:
            raise ConfigError(f"leader_on_follower must be 'skip' or 'wait' (got {mode!r})")
        return Rule(election, mode) if election else Rule(None)


def is_leader(election: str | None = None) -> bool:
    """Whether this process leads ``election`` now (default: the worker election).

    It never joins an election and never talks to the store: it answers from a
    lease this process already takes part in (a worker process's, for the
    actors it consumes, or the scheduler's in its process), otherwise
    ``False``. A test's pin (:mod:`celery_leader.pins`) answers first. To ask
    who leads from any process: :func:`celery_leader.leader_of`.
    """
    pin = _pin(election)
    if pin is not None:
        return pin.leads
    lease = _held(election)
    return lease is not None and lease.is_leader()


def current_epoch(election: str | None = None) -> int | None:
    """The fencing token of this process's current term of ``election``, else ``None``.

    Answered like :func:`is_leader`: never joins, ``None`` without a lease of this process.
    In a ``leader_only`` actor of ``election``, the epoch its message was let
    through with, for the whole body, even once the lease has ended
    (:func:`is_leader` tells that).
    """
    passed = body_epoch.of(election or _middleware().config.worker_election)
    if passed is not None:
        return passed
    pin = _pin(election)
    if pin is not None:
        return pin.epoch
    lease = _held(election)
    return None if lease is None else lease.epoch


def _pin(election: str | None) -> Role | None:
    """A test's pin of ``election`` (:mod:`celery_leader.pins`), if any."""
    return role_of(election or _middleware().config.worker_election)


def _held(election: str | None) -> Lease | None:
    """The lease of ``election`` a part of this process joined, if any (no join, no I/O)."""
    middleware = _middleware()
    config = middleware.process_config()
    return lease_set(config).lease_of(election or config.worker_election)


def _on_pins_changed() -> None:
    # A stopped middleware's worker is gone (or stopping): nothing to pause.
    if _current is not None and not _current._closed:
        _current._apply_all()


watch(_on_pins_changed)


def _middleware() -> LeaderMiddleware:
    if _current is None:
        raise ConfigError("no LeaderMiddleware in this process: add one to the broker")
    return _current


def _entry_names(actor: Any) -> list[str]:
    """Names of the schedule entries of ``actor`` (its name, or each schedule's ``name=``)."""
    schedules = schedules_of(actor.options.get("leader_schedule"))
    return [s.name or actor.actor_name for s in schedules]


def _describe(rule: Rule) -> str:
    if rule.election is None:
        return "ordinary"
    return f"leader_only {rule.election!r}, {rule.mode}"
