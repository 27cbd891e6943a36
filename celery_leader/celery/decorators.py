"""``@leader_only``: run a task body (or any function) only on the leader.

Importing this module connects a ``worker_init`` receiver that adds the worker
bootsteps to a starting worker whose app has a decorated task.
"""

from __future__ import annotations

import difflib
import functools
import logging
import random
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

from ..election import body_epoch
from ..exceptions import ConfigError, missing_extra
from ..settings.config import namespace_of, spelled, validate_name
from ..settings.startup import check_store
from . import leadership, routing
from .routing import ON_FOLLOWER, LeaderOnly, OnFollower, spec_of

try:
    from celery import signals
    from celery._state import get_current_app, get_current_task
    from celery.app.task import Task
    from celery.exceptions import Ignore, Reject
    from celery.local import Proxy
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

__all__ = ["CONSUMER_STEPS", "WORKER_STEP", "OnFollower", "add_steps", "leader_only"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: The worker bootsteps, by path: Celery loads them when it builds the
#: worker, so this module needs no import of :mod:`celery_leader.celery.worker`.
WORKER_STEP = "celery_leader.celery.worker:LeaderStep"
CONSUMER_STEPS = (
    "celery_leader.celery.worker:LeaderQueueStep",
    "celery_leader.celery.worker:FenceStep",
)

#: How long a follower holds a message before ``on_follower="reject"`` hands
#: it back, unless this node is elected meanwhile (then it runs it). It bounds
#: the redelivery rate while nobody leads: one per message per second.
REJECT_HOLD = 1.0


@overload
def leader_only(fn: F, /) -> F: ...


@overload
def leader_only(
    *,
    election: str | None = None,
    on_follower: OnFollower = "wait",
    max_retries: int | None = None,
    retry_backoff: float = 1.0,
    retry_backoff_max: float | None = None,
) -> Callable[[F], F]: ...


def leader_only(
    fn: Any = None,
    /,
    *,
    election: str | None = None,
    on_follower: OnFollower = "wait",
    max_retries: int | None = None,
    retry_backoff: float = 1.0,
    retry_backoff_max: float | None = None,
) -> Any:
    """Run the decorated function only while this process leads ``election``.

    Put it *below* ``@app.task``. On a follower, ``on_follower`` says what a task does:
    ``"wait"`` (sent to the election's leader queue), ``"skip"`` (``Ignore``),
    ``"retry"`` (backoff with jitter, capped by the ttl) or ``"reject"`` (requeue
    after :data:`REJECT_HOLD`; needs ``acks_late``). Outside a worker a follower's
    call returns ``None``. ``election`` defaults to ``leader_worker_election``.
    """
    if election is not None:
        validate_name("election", election)
    if on_follower not in ON_FOLLOWER:
        close = difflib.get_close_matches(str(on_follower), ON_FOLLOWER, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"@leader_only: on_follower must be one of {', '.join(map(repr, ON_FOLLOWER))} "
            f"(got {on_follower!r}){hint}"
        )
    if on_follower != "retry" and (
        max_retries is not None or retry_backoff != 1.0 or retry_backoff_max is not None
    ):
        raise ConfigError(
            "@leader_only: max_retries, retry_backoff and retry_backoff_max apply only "
            f"to on_follower='retry' (got on_follower={on_follower!r})"
        )
    if max_retries is not None and (
        isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
    ):
        raise ConfigError(
            f"@leader_only: max_retries must be None (no limit) or an integer >= 0 "
            f"(got {max_retries!r})"
        )
    for name, value in (("retry_backoff", retry_backoff), ("retry_backoff_max", retry_backoff_max)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
        ):
            raise ConfigError(
                f"@leader_only: {name} must be a number of seconds greater than 0 (got {value!r})"
            )
    spec = LeaderOnly(election, on_follower, max_retries, float(retry_backoff), retry_backoff_max)
    if fn is None:
        return functools.partial(_decorate, spec)
    return _decorate(spec, fn)


def _decorate(spec: LeaderOnly, fn: Any) -> Any:
    _check_target(fn)
    if spec.election is not None:
        leadership.name_election(spec.election)
    if spec.on_follower == "wait":
        # The apps of this process send this task to its leader queue from now on.
        routing.route_existing_apps()
    key = spec.election
    cached_view = leadership.cached_view
    view = leadership.view
    enter, leave = body_epoch.enter, body_epoch.leave

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        app = get_current_app()
        found = cached_view((app, key)) or view(app, key)
        # The check reads the epoch itself, and the body runs with it: _run,
        # inlined here because this is every call's path.
        epoch = found.epoch()
        if epoch is None:
            return _follower(spec, app, fn, args, kwargs)
        token = enter(found.election, epoch)
        try:
            return fn(*args, **kwargs)
        finally:
            leave(token)

    wrapper.__leader_only__ = spec  # type: ignore[attr-defined]
    return wrapper


def _run(election: str, epoch: int, fn: Any, args: Any, kwargs: Any) -> Any:
    """Run a body that passed its check of ``election`` under ``epoch`` (``current_epoch()``
    in the body answers it, even once the term has ended)."""
    token = body_epoch.enter(election, epoch)
    try:
        return fn(*args, **kwargs)
    finally:
        body_epoch.leave(token)


def _check_target(fn: object) -> None:
    # Look at type(fn) only: isinstance() on a lazy task proxy would evaluate
    # it, creating the task in the middle of the import.
    kind = type(fn)
    if issubclass(kind, (Proxy, Task)):
        raise TypeError(
            f"@leader_only is applied to the Celery task {_name_of(fn)!r}: put it below "
            "@app.task (or @shared_task) so that it wraps the function, like\n"
            "    @app.task\n    @leader_only\n    def my_task(): ..."
        )
    if isinstance(fn, type):
        raise TypeError(
            f"@leader_only decorates functions, not classes (got class {fn.__qualname__!r}); "
            "for a Task subclass, call celery_leader.is_leader() inside run()"
        )
    if not callable(fn):
        raise TypeError(f"@leader_only decorates functions (got {kind.__name__} {fn!r})")


def _name_of(task: Any) -> str:
    # A lazy proxy's attributes would evaluate it; its repr does not.
    return str(task.name) if issubclass(type(task), Task) else repr(task)


def _follower(spec: LeaderOnly, app: Any, fn: Any, args: Any, kwargs: Any) -> Any:
    task = get_current_task()
    request = None if task is None else task.request
    if (
        request is None
        or request.called_directly
        or request.is_eager
        # A plain decorated function that a task body calls: only the caller
        # is told "not the leader"; the enclosing task is not ours to stop.
        or spec_of(task) is not spec
    ):
        return None
    config = leadership.config_of(app)
    election = config.worker_election if spec.election is None else spec.election
    if spec.on_follower == "wait":
        queue = routing.leader_queue(election, app=app)
        logger.info(
            "celery-leader: forwarded %s[%s] to %s: this worker does not lead %r",
            task.name,
            request.id,
            queue,
            election,
        )
        raise _retry(task, None, queue=queue, countdown=0)
    if spec.on_follower == "skip":
        logger.info(
            "celery-leader: skipped %s[%s]: this worker does not lead %r",
            task.name,
            request.id,
            election,
        )
        raise Ignore()
    if spec.on_follower == "reject":
        # Hold the message a while instead of bouncing it between followers
        # at broker speed while nobody leads; run it if elected meanwhile.
        found = leadership.view(app, spec.election)
        deadline = time.monotonic() + REJECT_HOLD
        while time.monotonic() < deadline:
            time.sleep(0.01)
            epoch = found.epoch()
            if epoch is not None:
                return _run(found.election, epoch, fn, args, kwargs)
        logger.info(
            "celery-leader: requeued %s[%s]: this worker does not lead %r",
            task.name,
            request.id,
            election,
        )
        raise Reject(f"not the leader of {election!r}", requeue=True)
    cap = config.ttl if spec.retry_backoff_max is None else spec.retry_backoff_max
    delay = min(cap, spec.retry_backoff * 2.0 ** min(request.retries, 32))
    # Equal jitter: never zero (followers would bounce the task between
    # themselves), and spread so that many retried tasks do not arrive together.
    countdown = delay / 2 + random.uniform(0, delay / 2)
    logger.info(
        "celery-leader: retrying %s[%s] in %.2f s: this worker does not lead %r",
        task.name,
        request.id,
        countdown,
        election,
    )
    raise _retry(task, spec.max_retries, countdown=countdown)


def _retry(task: Any, max_retries: int | None, **options: Any) -> Any:
    """``task.retry(**options)``, where ``max_retries=None`` means no limit."""
    # Task.retry(max_retries=None) means "the task's default" (3), not "no
    # limit"; a limit no task reaches does mean it. retry() also stores the
    # value on the shared task object, where autoretry_for would pick it up
    # for the user's own retries: put back what was there.
    limit = sys.maxsize if max_retries is None else max_retries
    missing = object()
    saved = task.__dict__.get("override_max_retries", missing)
    try:
        return task.retry(max_retries=limit, **options)
    finally:
        if saved is missing:
            task.__dict__.pop("override_max_retries", None)
        else:
            task.override_max_retries = saved


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """Prepare a starting worker: add the bootsteps if needed, check the settings.

    ``worker_init`` comes after the task modules are imported and before the
    blueprint is built from ``app.steps``. A bad setting ends the process with
    one line and exit status 1, not a traceback through Celery's bootsteps.
    """
    if sender is None:
        return
    app = sender.app
    if any(spec_of(t) is not None for t in list(app.tasks.values())):
        add_steps(app)
    if WORKER_STEP not in app.steps["worker"]:
        return
    try:
        config = leadership.config_of(app)
        # Build the store too: one it cannot build (file:///proc/nope, django://
        # on SQLite) fails here, not in the lease's loop with a traceback.
        check_store(config, spelled("leader_url", namespace_of(app)))
        leader_queues = routing.leader_queues(app, config.worker_election)
        queues = app.amqp.queues
        # Queues named by -Q; None without -Q (then the worker consumes task_queues).
        named = getattr(queues, "_consume_from", None) or {}
        routing.check_consumed_queues(app, leader_queues, named)
        routing.consume_only_while_leading(app, leader_queues.values())
    except ConfigError as exc:
        print(f"celery-leader: cannot start worker {sender.hostname}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def add_steps(app: Any) -> None:
    """Add the celery-leader bootsteps to ``app``'s workers. Idempotent."""
    app.steps["worker"].add(WORKER_STEP)
    app.steps["consumer"].update(CONSUMER_STEPS)


signals.worker_init.connect(_on_worker_init, weak=False, dispatch_uid="celery_leader.worker_init")
