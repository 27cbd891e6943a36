"""``LeaderMiddleware``: its settings, the actors' leader options, and its parts.

Every Dramatiq process that builds the broker gets its own middleware instance.
It passes Dramatiq's hooks to its parts, each a middleware of one concern:
:class:`ActorRules` (here), ``BrokerReach`` and ``Campaign`` (a worker
process's part in its elections, :mod:`.campaign`), ``Gates`` and
``LeaderOnly`` (messages of leader-only actors, :mod:`.gate`) and, with
``leader_ledger``, ``LedgerStep`` (:mod:`.ledger`). The scheduler campaigns in
its own election. :func:`is_leader` never joins: in any other process (a web
server) it answers "not leading".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dramatiq.common import q_name
from dramatiq.middleware import Middleware, MiddlewareError

from .. import body_epoch
from ..config import LeaderConfig, validate_name
from ..exceptions import ConfigError
from ..lease import Lease
from ..leases import lease_set
from ..pins import role_of, watch
from ..process import default_instance_id
from .campaign import BrokerReach, Campaign
from .cli_errors import one_line_errors
from .gate import Gates, LeaderOnly
from .ledger import LedgerStep
from .scheduler import schedules_of
from .settings import load_config

# The middleware of this process, for is_leader() and current_epoch(), which
# take no broker: module-wide, as Dramatiq's own global broker is.
_current: LeaderMiddleware | None = None


def _to_parts(hook: str) -> Callable[..., None]:
    """Dramatiq's ``hook``, passed on to each part in order (one that raises stops it)."""

    def to_parts(self: LeaderMiddleware, *args: Any, **kwargs: Any) -> None:
        for part in self.parts:
            getattr(part, hook)(*args, **kwargs)

    to_parts.__name__ = to_parts.__qualname__ = hook
    return to_parts


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
        rules = ActorRules(self.config.worker_election)
        reach = BrokerReach(rules)
        # The gates ask the campaign who leads; the campaign tells them of each change.
        self.gates = Gates(rules, lambda election: self.campaign.leads(election))
        # With scheduler=True, the scheduler's fork process serves the health port.
        port = None if scheduler else self.config.health_port
        self.campaign = Campaign(self.process_config, port, rules, self.gates, reach)
        #: Dramatiq's hooks go to each of these in turn.
        self.parts: list[Middleware] = [
            rules,
            reach,
            self.gates,
            self.campaign,
            LeaderOnly(rules, self.campaign.epoch, self.gates),
        ]
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
        from .runner import embedded_scheduler  # it imports this module

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


#: What a follower does with a leader-only actor's message.
MODES = ("skip", "wait")


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


ORDINARY = Rule(None)


class ActorRules(Middleware):
    """The rule of each declared actor and queue; a bad one fails its declaration."""

    def __init__(self, worker_election: str) -> None:
        self.worker_election = worker_election  # what ``leader_only=True`` means
        #: Leader-only actor name -> its rule.
        self.leader_only: dict[str, Rule] = {}
        self._queues: dict[str, tuple[Rule, str]] = {}  # queue -> rule, an actor showing it
        self._entries: dict[str, str] = {}  # schedule entry name -> its actor

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
            self.leader_only.pop(actor.actor_name, None)
        else:
            self.leader_only[actor.actor_name] = rule

    def of_queue(self, queue: str) -> Rule:
        """The rule of ``queue``'s actors; a delay queue's is its queue's."""
        return self._queues.get(q_name(queue), (ORDINARY, ""))[0]

    def elections(self, queues: Iterable[str]) -> set[str]:
        """The elections of the leader-only actors on ``queues`` (or their delay queues)."""
        return {rule.election for rule in map(self.of_queue, queues) if rule.election is not None}

    def _rule_of(self, actor: Any) -> Rule:
        options = actor.options
        names = _entry_names(actor)
        if len(set(names)) != len(names):
            raise ConfigError("two leader_schedule entries share a name: give them name=")
        only = options.get("leader_only", False)
        mode = options.get("leader_on_follower")
        if only is True:
            election: str | None = self.worker_election
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
        return Rule(election, mode) if election else ORDINARY


def _entry_names(actor: Any) -> list[str]:
    """Names of the schedule entries of ``actor`` (its name, or each schedule's ``name=``)."""
    schedules = schedules_of(actor.options.get("leader_schedule"))
    return [s.name or actor.actor_name for s in schedules]


def _describe(rule: Rule) -> str:
    if rule.election is None:
        return "ordinary"
    return f"leader_only {rule.election!r}, {rule.mode}"


def is_leader(election: str | None = None) -> bool:
    """Whether this process leads ``election`` now (default: the worker election).

    It never joins an election and never talks to the store: it answers from a
    lease this process already takes part in (a worker process's, for the
    actors it consumes, or the scheduler's in its process), otherwise
    ``False``. A test's pin (:mod:`celery_leader.pins`) answers first. To ask
    who leads from any process: :func:`celery_leader.leader_of`.
    """
    election = election or _middleware().config.worker_election
    pin = role_of(election)
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
