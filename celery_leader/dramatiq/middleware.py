"""``LeaderMiddleware``: settings, leader-only actors and the embedded scheduler.

Every Dramatiq process that builds the broker gets its own middleware instance,
and each worker process holds its own leases (instance id ``host:pid``).
Leases are released at the first SIGTERM or SIGHUP, in ``before_worker_shutdown``
and, because ``atexit`` does not run in Dramatiq's worker processes, by a
``multiprocessing.util.Finalize`` too: a second SIGTERM (Dramatiq's main process
relays the one systemd sends to the whole group) skips the shutdown hooks but
not the finalizers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.util import Finalize
from typing import Any

from ..backends import Backend, create_backend
from ..config import LeaderConfig, validate_name
from ..exceptions import ConfigError, LeaderError, missing_extra
from ..lease import Lease
from ..pins import Role, role_of, watch
from .runner import embedded_scheduler
from .scheduler import schedules_of
from .settings import load_config

try:
    from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "dramatiq") from None

logger = logging.getLogger("celery_leader.dramatiq")

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
    mode: str = "skip"


class LeaderMiddleware(Middleware):
    """Leader election for Dramatiq: ``leader_schedule``, ``leader_only``, ``leader_on_follower``.

    Arguments not given are read from ``CELERY_LEADER_*`` (Django settings
    under django_dramatiq, else the environment). ``scheduler=True`` runs the
    scheduler in a fork process of ``dramatiq``; without it, run
    ``python -m celery_leader.dramatiq MODULE`` beside the workers.
    """

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
        self._pid_instance = self.config.instance_id == _default_instance_id()
        self._rules: dict[str, Rule] = {}  # actor name -> rule
        self._queues: dict[str, tuple[Rule, str]] = {}  # queue -> rule, an actor showing it
        self._entries: dict[str, str] = {}  # schedule entry name -> its actor
        self._lock = threading.Lock()
        self._stop_lock = threading.Lock()  # a second stop() waits for the first one
        self._apply_lock = threading.Lock()  # one pause/resume decision at a time
        self._backend: Backend | None = None
        self._leases: dict[str, Lease] = {}
        self._pid = os.getpid()
        self._closed = False  # stop() ran: never join an election again in this process
        self._worker: Any = None
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
            return dataclasses.replace(self.config, instance_id=_default_instance_id())
        return self.config

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
        """Release at the first SIGTERM or SIGHUP, before Dramatiq's own handler runs.

        Dramatiq's worker process only notices a SIGTERM at its next one-second
        poll; and when the signal reaches the whole group, Dramatiq's relayed copy
        often merges with it, so no second signal hurries it along.
        """
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

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        """Join the elections of this process's leader-only actors; pause ``wait`` queues."""
        if self._worker is not None:
            # An earlier Worker of this process stopped (only tests start one
            # after another): this one may lead again. A process whose first
            # worker boots after a SIGTERM stays closed.
            with self._lock:
                self._closed = False
        self._worker = worker
        for election in sorted({r.election for r in self._rules.values() if r.election}):
            self.lease(election)
        self._apply_all()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        """Hand over at once, before in-flight messages finish."""
        self.stop()

    def before_process_message(self, broker: Any, message: Any) -> None:
        """Let a leader-only actor's message through only on the leading process.

        Fails closed: any error here skips the message, because Dramatiq runs
        the actor when a middleware raises anything but a ``MiddlewareError``.
        """
        try:
            rule = self._rules.get(message.actor_name)
            if rule is None or rule.election is None:
                return
            try:
                if self.leads(rule.election):
                    return
            except Exception:
                logger.exception(
                    "celery-leader: leadership check of %r failed; not running %s",
                    rule.election,
                    message.actor_name,
                )
            if rule.mode == "wait":
                self._requeue(message)
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
        """Whether this process leads ``election`` now: a test's pin, else the lease."""
        pin = role_of(election)
        if pin is not None:
            return pin.leads
        return not self._closed and self.lease(election).is_leader()

    def lease(self, election: str | None = None) -> Lease:
        """This process's lease of ``election`` (default: worker election), joined on first use."""
        election = election or self.config.worker_election
        with self._lock:
            if self._pid != os.getpid():  # inherited through a fork: start afresh
                self._pid, self._leases, self._backend = os.getpid(), {}, None
                self._closed = False
            if self._closed:
                raise LeaderError("LeaderMiddleware stopped: this process is shutting down")
            lease = self._leases.get(election)
            if lease is None:
                config = self.process_config()
                if self._backend is None:
                    self._backend = create_backend(config)
                    Finalize(self, self.stop, exitpriority=100)
                lease = Lease.from_config(
                    election,
                    config,
                    self._backend,
                    on_elected=self._apply,
                    on_demoted=self._apply,
                )
                self._leases[election] = lease
                lease.start()
        return lease

    def stop(self) -> None:
        """Leave every election of this process (demote, release, wake a follower).

        Callers racing it (a signal's release thread, the shutdown hook, the
        finalizer at exit) wait until the first one has released.
        """
        with self._stop_lock:
            with self._lock:
                self._closed = True
                leases, self._leases = list(self._leases.values()), {}
                backend, self._backend = self._backend, None
            for lease in leases:
                lease.stop()
            if backend is not None:
                backend.close()

    # -- wait mode ----------------------------------------------------------

    def _apply(self, lease: Lease) -> None:
        """Consume the ``wait`` queues of ``lease``'s election only while leading it."""
        self._apply_to(lease.election)

    def _apply_all(self) -> None:
        """Pause or resume every ``wait`` queue to match who leads (a pin, else the lease).

        Returns once each consumer paused by a pin has stopped taking
        messages, so that a message the test sends next stays in the queue: a
        consumer that had taken it would re-enqueue it, which ``StubBroker``
        cannot do.
        """
        for election in {rule.election for rule, _ in self._queues.values() if rule.election}:
            paused = self._apply_to(election)
            if role_of(election) is not None:
                for consumer in paused:
                    if consumer.is_alive():
                        consumer.paused_event.wait(PAUSE_TIMEOUT)

    def _apply_to(self, election: str) -> list[Any]:
        """Pause or resume the ``wait`` queues of ``election``; the consumers paused.

        Serialized: the lease thread (on election or demotion) and a test
        changing the pins both call it, and each must act on what it read,
        not resume a queue after the other paused it on newer news.
        """
        worker = self._worker
        if worker is None:
            return []
        paused = []
        with self._apply_lock:
            leading = self.leads(election)
            for queue, (rule, _) in self._queues.items():
                consumer = worker.consumers.get(queue)
                if rule.election != election or rule.mode != "wait" or consumer is None:
                    continue
                if leading:
                    consumer.resume()
                else:
                    consumer.pause()
                    paused.append(consumer)
                logger.info(
                    "celery-leader: %s queue %r (%s %r)",
                    "consuming" if leading else "paused",
                    queue,
                    "leader of" if leading else "not leading",
                    election,
                )
        return paused

    def _requeue(self, message: Any) -> None:
        """Put a prefetched message back on its queue for the leader to take."""
        logger.info(
            "celery-leader: re-enqueueing %s (%s): this process does not lead",
            message.actor_name,
            message.message_id,
        )
        self._worker.consumers[message.queue_name].requeue_messages([message])

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
            mode = "skip"
        elif election is None:
            raise ConfigError("leader_on_follower needs leader_only=True (or an election name)")
        if mode not in MODES:
            raise ConfigError(f"leader_on_follower must be 'skip' or 'wait' (got {mode!r})")
        return Rule(election, mode if election else "skip")


def is_leader(election: str | None = None) -> bool:
    """Whether this process leads ``election`` now (default: the worker election)."""
    pin = _pin(election)
    if pin is not None:
        return pin.leads
    lease = _lease(election)
    return lease is not None and lease.is_leader()


def current_epoch(election: str | None = None) -> int | None:
    """The fencing token of this process's current term of ``election``, else ``None``."""
    pin = _pin(election)
    if pin is not None:
        return pin.epoch
    lease = _lease(election)
    return None if lease is None else lease.epoch


def _pin(election: str | None) -> Role | None:
    """A test's pin of ``election`` (:mod:`celery_leader.pins`), if any."""
    return role_of(election or _middleware().config.worker_election)


def _lease(election: str | None) -> Lease | None:
    """This process's lease of ``election``; ``None`` once the process is shutting down."""
    middleware = _middleware()
    try:
        return middleware.lease(election)
    except LeaderError:
        if middleware._closed:
            return None
        raise


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


def _default_instance_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _describe(rule: Rule) -> str:
    if rule.election is None:
        return "ordinary"
    return f"leader_only {rule.election!r}, {rule.mode}"
