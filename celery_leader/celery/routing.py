"""Leader queues: where ``@leader_only(on_follower="wait")`` tasks are sent.

Each election has a queue, ``<leader_key_prefix>.leader.<election>``
(:func:`leader_queue`), that only the worker node leading the election
consumes: the node adds the consumer when it is elected and cancels it when it
is demoted (:mod:`celery_leader.celery.worker`). Messages wait there while nobody
leads, and the next leader runs them.

The queue is declared as the app declares its own: a leader queue listed in
``task_queues`` is used as listed, any other is made as Celery makes a missing
queue (``task_create_missing_queue_type``, so quorum when that says so, and
``task_create_missing_queue_exchange_type``), also with
``task_create_missing_queues = False``: it is this library's queue, not a
typo. :func:`declare` puts it in ``app.amqp.queues``, where senders, the
consumer and Celery's native delayed delivery (which binds every queue there)
all find the same declaration.

Senders route there by themselves: :func:`route` is a Celery router that
:func:`route_leader_tasks` puts first in an app's ``task_routes``. That
happens for every app when it is finalized (``celery beat`` and ``celery
worker`` always finalize it) and for the apps that exist when a task module
decorates a function, so ``delay()``, ``apply_async()`` and beat need nothing
more. ``send_task()`` by name from a process that does not have the task
must pass ``queue=leader_queue(...)``; without it, the message is forwarded to
the leader queue by the first worker that receives it (one extra delivery).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..exceptions import ConfigError, missing_extra
from ..settings.config import DEFAULT_KEY_PREFIX, validate_name

try:
    from celery._state import _get_active_apps, connect_on_app_finalize, get_current_app
    from kombu.common import Broadcast
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

__all__ = [
    "LeaderOnly",
    "OnFollower",
    "check_consumed_queues",
    "consume_only_while_leading",
    "declare",
    "declare_on_broker",
    "leader_queue",
    "leader_queues",
    "route",
    "route_existing_apps",
    "route_leader_tasks",
    "spec_of",
]

logger = logging.getLogger(__name__)

#: What a follower does with a task it received.
OnFollower = Literal["wait", "skip", "retry", "reject"]
ON_FOLLOWER: tuple[OnFollower, ...] = ("wait", "skip", "retry", "reject")


@dataclass(frozen=True, eq=False)
class LeaderOnly:
    """How one decorated function behaves; kept as ``fn.__leader_only__``.

    Compared by identity: the follower path uses it to tell "I am the body of
    the task being executed" from "I am a plain function that task called".
    """

    election: str | None
    on_follower: OnFollower
    max_retries: int | None
    retry_backoff: float
    retry_backoff_max: float | None


def spec_of(task: Any) -> LeaderOnly | None:
    """The ``@leader_only`` settings of a Celery task's body, if it has any."""
    spec = getattr(getattr(task, "run", None), "__leader_only__", None)
    return spec if isinstance(spec, LeaderOnly) else None


def leader_queue(election: str | None = None, *, app: Any = None) -> str:
    """Name of the queue that only the leader of ``election`` consumes.

    ``<leader_key_prefix>.leader.<election>``; ``election`` defaults to
    ``leader_worker_election`` and ``app`` to the current app. Only these two
    settings are read, so a sender needs no store settings.
    """
    app = get_current_app() if app is None else app
    conf = app.conf
    prefix = conf.get("leader_key_prefix")
    prefix = DEFAULT_KEY_PREFIX if prefix is None else validate_name("leader_key_prefix", prefix)
    if election is None:
        default = conf.get("leader_worker_election")
        election = "worker" if default is None else default
    return f"{prefix}.leader.{validate_name('election', election)}"


def route(
    name: str, args: Any, kwargs: Any, options: Mapping[str, Any], task: Any = None, **_: Any
) -> dict[str, str] | None:
    """Celery router: a ``wait``-mode ``@leader_only`` task goes to its leader queue.

    Other tasks are left to the routers after this one. A ``queue`` passed to
    ``apply_async()`` still wins, as for any Celery router.
    """
    spec = spec_of(task)
    if spec is None or spec.on_follower != "wait":
        return None
    name = leader_queue(spec.election, app=task.app)
    declare(task.app, name)
    return {"queue": name}


def declare(app: Any, name: str) -> Any:
    """The kombu ``Queue`` of leader queue ``name`` in ``app.amqp.queues``, added if missing.

    Never consumed because of this: a worker's consumed set was fixed before.
    """
    queues = app.amqp.queues
    # "in", not a lookup: Queues.__missing__ would make a queue or raise QueueNotFound.
    if name not in queues:
        try:
            queues.add(queues.new_missing(name))
        except ValueError as exc:  # Celery's word on a bad task_create_missing_queue_type
            raise ConfigError(f"cannot declare leader queue {name!r}: {exc}") from None
    return queues[name]


def route_leader_tasks(app: Any) -> None:
    """Put :func:`route` first in ``app``'s ``task_routes``. Idempotent.

    An app that is not configured yet gets it once it is, so that reading its
    settings here does not freeze them before ``config_from_object()``.
    """
    if not app.configured:
        app.on_after_configure.connect(_on_configured, weak=False, dispatch_uid=_UID)
        return
    routes = app.conf.task_routes
    if routes is None:
        app.conf.task_routes = (route,)
    elif isinstance(routes, (list, tuple)):
        if route not in routes:
            app.conf.task_routes = (route, *routes)
    elif routes is not route:
        app.conf.task_routes = (route, routes)


_UID = "celery_leader.route_leader_tasks"


def _on_configured(sender: Any = None, **_: Any) -> None:
    if sender is not None:
        route_leader_tasks(sender)


def route_existing_apps() -> None:
    """Route in every app of this process (a module just decorated a task)."""
    for app in list(_get_active_apps()):
        route_leader_tasks(app)


def leader_queues(app: Any, default_election: str) -> dict[str, str]:
    """Election -> leader queue, for the elections of ``app``'s ``wait``-mode tasks."""
    queues = {}
    for task in list(app.tasks.values()):
        spec = spec_of(task)
        if spec is not None and spec.on_follower == "wait":
            election = default_election if spec.election is None else spec.election
            queues[election] = leader_queue(election, app=app)
    return queues


def check_consumed_queues(app: Any, queues: Mapping[str, str], consumed: Iterable[str]) -> None:
    """Refuse a worker told to consume a leader queue from the start, or routing to one.

    ``consumed`` is what ``-Q`` named. A leader queue is consumed only by the
    node leading its election, and only while it leads; ordinary tasks sent
    there would wait for the leader. (Listed in ``task_queues`` without ``-Q``
    is fine: it declares the queue, and :func:`consume_only_while_leading`
    takes it out of what the worker consumes from the start.)
    """
    by_queue = {queue: election for election, queue in queues.items()}
    for queue in consumed:
        if queue in by_queue:
            raise ConfigError(
                f"this worker is told to consume {queue!r} (-Q), the leader queue of election "
                f"{by_queue[queue]!r}: remove it from -Q; the node leading "
                f"{by_queue[queue]!r} consumes it by itself, only while it leads"
            )
    default = app.conf.task_default_queue
    if default in by_queue:
        raise ConfigError(
            f"task_default_queue is {default!r}, the leader queue of election "
            f"{by_queue[default]!r}: ordinary tasks would wait there for the leader; "
            "choose another default queue"
        )


def declare_on_broker(app: Any, names: Iterable[str]) -> None:
    """Declare leader queues (and their exchanges) on an AMQP broker now, once.

    Done as the worker starts, before its consumer: Celery's native delayed
    delivery then binds every known queue's exchange, and fails (CRITICAL,
    for all queues) on an exchange nobody declared yet, which a leader queue's
    is until some node leads. Durable, so later starts find them. A broker
    that cannot be reached now is left to the consumer's own retries.
    """
    names = list(names)
    if not names:
        return
    with app.connection_for_write() as conn:
        if conn.transport.driver_type != "amqp":
            return
        try:
            conn.ensure_connection(max_retries=1)
            channel = conn.default_channel
            for name in names:
                declare(app, name)(channel).declare()
        except Exception as exc:  # the worker starts anyway; its consumer retries
            logger.warning("celery-leader: could not declare %s yet: %s", ", ".join(names), exc)


def consume_only_while_leading(app: Any, queues: Iterable[str]) -> None:
    """Declare the leader queues; fix the worker's consumed queues to what it consumes
    now, minus the leader queues.

    Declared in the worker before its consumer starts, so that the consumer,
    Celery's quorum-queue detection (no global QoS) and native delayed
    delivery (which binds every declared queue) see them.

    Without ``-Q`` a worker consumes every queue in ``task_queues`` (a leader
    queue listed there among them) and every queue the app adds later (sending
    a wait-mode task declares its leader queue): naming today's queues keeps
    a restarting consumer from picking up a leader queue.
    """
    leader = set(queues)
    for queue in leader:
        if isinstance(declare(app, queue), Broadcast):
            raise ConfigError(
                f"task_queues declares leader queue {queue!r} as a Broadcast queue: every "
                "worker would get a copy; declare it as a plain Queue or leave it out"
            )
    amqp_queues = app.amqp.queues
    keep = [name for name in amqp_queues.consume_from if name not in leader]
    if not keep:
        raise ConfigError(
            "this worker would consume nothing but leader queues, and only while it leads: "
            "give it an ordinary queue too (-Q or task_queues)"
        )
    amqp_queues.select(keep)


connect_on_app_finalize(route_leader_tasks)
