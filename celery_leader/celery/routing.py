"""Leader queues: where ``@leader_only(on_follower="wait")`` tasks are sent.

Each election has a queue, ``<leader_key_prefix>.leader.<election>``, that only
the worker node leading the election consumes, while it leads. It is declared
as the app declares its own, in ``app.amqp.queues``. :func:`route`, first in
every app's ``task_routes``, sends the tasks there; ``send_task()`` by name
needs ``queue=leader_queue(...)`` (else a worker forwards it: one extra delivery).
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

logger = logging.getLogger(__name__)

#: What a follower does with a task it received.
OnFollower = Literal["wait", "skip", "retry", "reject"]
ON_FOLLOWER: tuple[OnFollower, ...] = ("wait", "skip", "retry", "reject")


@dataclass(frozen=True, eq=False)
class LeaderOnly:
    """How one decorated function behaves; kept as ``fn.__leader_only__``. Compared by
    identity: the body of the running task, or a plain function that task called."""

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
    """Name of the queue that only the leader of ``election`` consumes (default:
    ``leader_worker_election``); a sender needs no store settings."""
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
    """Celery router: a ``wait``-mode ``@leader_only`` task goes to its leader queue."""
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
    """Put :func:`route` first in ``app``'s ``task_routes``. Idempotent. An app not
    configured yet gets it once it is (reading its settings would freeze them)."""
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
    """Refuse a worker told (``consumed``: by ``-Q``) to consume a leader queue from the
    start, or whose default queue is one."""
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

    Celery's native delayed delivery binds every known queue's exchange as the
    consumer starts, and fails for all queues on one nobody declared yet.
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
    now, minus the leader queues (without ``-Q`` a restarting consumer would pick up
    every queue the app added since, leader queues among them)."""
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
