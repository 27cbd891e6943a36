"""``@leader_only``: run a task body (or any function) only on the leader.

Contract::

    @app.task
    @leader_only                                  # election = leader_worker_election
    def refresh_prices(): ...

    @app.task
    @leader_only(election="reports", on_follower="retry")
    def build_report(day): ...

Where leadership comes from, in the order tried:

1. the worker's deadline table (:mod:`celery_leader._shared`), which the
   worker bootstep (:mod:`celery_leader.worker`) fills for every election named
   by a decorated function when the worker starts: a pool process reads one
   float from shared memory, no round trip;
2. otherwise a lease that this process joins on first use, with the settings
   of the current Celery app (a plain function in a web process, a script, or
   an election first named after the worker started).
"""

from __future__ import annotations

import atexit
import difflib
import functools
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from . import _shared
from .backends import create_backend
from .backends.base import Backend
from .config import LeaderConfig, validate_name
from .exceptions import ConfigError, StoreUnavailable, missing_extra
from .lease import Lease
from .signals import elected as _elected  # noqa: F401 - importing it connects the signals

try:
    from celery import signals
    from celery._state import get_current_app, get_current_task
    from celery.app.task import Task
    from celery.exceptions import Ignore, Reject
    from celery.local import Proxy
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

__all__ = ["OnFollower", "is_leader", "leader_only"]

logger = logging.getLogger("celery_leader.decorators")

F = TypeVar("F", bound=Callable[..., Any])

#: What a follower does with a task it received.
OnFollower = Literal["skip", "retry", "reject"]
_ON_FOLLOWER = ("skip", "retry", "reject")


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


# Elections named by decorated functions in this process; the worker
# bootstep joins them all (plus leader_worker_election) when it starts.
_named_elections: set[str] = set()


@overload
def leader_only(fn: F, /) -> F: ...


@overload
def leader_only(
    *,
    election: str | None = None,
    on_follower: OnFollower = "skip",
    max_retries: int | None = None,
    retry_backoff: float = 1.0,
    retry_backoff_max: float | None = None,
) -> Callable[[F], F]: ...


def leader_only(
    fn: Any = None,
    /,
    *,
    election: str | None = None,
    on_follower: OnFollower = "skip",
    max_retries: int | None = None,
    retry_backoff: float = 1.0,
    retry_backoff_max: float | None = None,
) -> Any:
    """Run the decorated function only while this process leads ``election``.

    Put it *below* ``@app.task``. On a follower, a task body does not run:

    * ``on_follower="skip"`` (default): log at INFO and raise
      :class:`celery.exceptions.Ignore` (the task is dropped, no result stored);
    * ``"retry"``: retry with exponential backoff and jitter, so that the
      leader can take the task. The first delay is ``retry_backoff`` seconds,
      doubling up to ``retry_backoff_max`` (default: the election's ttl, by
      which a crashed leader has been replaced). ``max_retries=None`` (default)
      retries without limit; with a number, the task fails with
      :class:`celery.exceptions.MaxRetriesExceededError` when it runs out.
      Follower retries count in ``self.request.retries`` like any other retry.
    * ``"reject"``: raise ``Reject(requeue=True)`` so the broker redelivers the
      message; the task needs ``acks_late=True`` (the worker warns at startup
      when it lacks it).

    Called outside a worker (a plain function, a task called directly or
    eagerly), a follower's call returns ``None`` without running the body.

    ``election`` defaults to the ``leader_worker_election`` setting. Bad
    arguments, a class, or a decorator order with ``@leader_only`` above
    ``@app.task`` raise at import time.
    """
    if election is not None:
        validate_name("election", election)
    if on_follower not in _ON_FOLLOWER:
        close = difflib.get_close_matches(str(on_follower), _ON_FOLLOWER, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"@leader_only: on_follower must be one of 'skip', 'retry', 'reject' "
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
        _named_elections.add(spec.election)
    key = spec.election

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        app = get_current_app()
        try:
            leads = _views[app, key]
        except KeyError:
            leads = _view(app, key)
        if leads():
            return fn(*args, **kwargs)
        return _follower(spec, app)

    wrapper.__leader_only__ = spec  # type: ignore[attr-defined]
    return wrapper


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


def spec_of(task: Any) -> LeaderOnly | None:
    """The ``@leader_only`` settings of a Celery task's body, if it has any."""
    return getattr(getattr(task, "run", None), "__leader_only__", None)


def _name_of(task: Any) -> str:
    # A lazy proxy's attributes would evaluate it; its repr does not.
    return str(task.name) if issubclass(type(task), Task) else repr(task)


def is_leader(election: str | None = None, *, app: Any = None) -> bool:
    """True while this process (or its worker) leads ``election``.

    The same check ``@leader_only`` makes: in a worker's pool process it reads
    the deadline the worker published; elsewhere it joins the election on the
    first call. ``election`` defaults to ``leader_worker_election`` and
    ``app`` to the current Celery app.
    """
    if election is not None:
        validate_name("election", election)
    app = get_current_app() if app is None else app
    try:
        leads = _views[app, election]
    except KeyError:
        leads = _view(app, election)
    return leads()


# -- where leadership comes from --------------------------------------------

# (app, election as decorated: None = default) -> zero-argument check.
_views: dict[tuple[Any, str | None], Callable[[], bool]] = {}
_configs: dict[Any, LeaderConfig] = {}
_local_leases: dict[tuple[Any, str], Lease] = {}
_local_backends: dict[Any, Backend] = {}
_lock = threading.RLock()


def config_of(app: Any) -> LeaderConfig:
    """The validated settings of ``app``, read once per process."""
    config = _configs.get(app)
    if config is None:
        config = _configs[app] = LeaderConfig.from_app(app)
    return config


def _view(app: Any, key: str | None) -> Callable[[], bool]:
    with _lock:
        view = _views.get((app, key))
        if view is not None:
            return view
        config = config_of(app)
        election = config.worker_election if key is None else key
        table = _shared.process_table()
        if table is not None and table.store != _shared.store_id(config.url, config.key_prefix):
            table = None  # another app's worker: its leases are not ours
        index = None if table is None else table.index(election)
        if table is not None and index is not None:
            view = table.checker(index)
        else:
            view = _local_lease(app, election).is_leader
        _views[app, key] = view
        return view


def _local_lease(app: Any, election: str) -> Lease:
    """Join ``election`` from this process, once, and wait for the first outcome.

    Waiting (at most one store timeout) means the first call already knows
    whether it leads, instead of always answering "no".
    """
    lease = _local_leases.get((app, election))
    if lease is not None:
        return lease
    config = config_of(app)
    backend = _local_backends.get(app)
    if backend is None:
        backend = _local_backends[app] = create_backend(config)
    decided = threading.Event()
    lease = Lease.from_config(election, config, backend, on_elected=lambda _lease: decided.set())
    _local_leases[app, election] = lease
    logger.info(
        "celery-leader: %s joins election %r from this process (store %s)",
        config.instance_id,
        election,
        config.display_url,
    )
    lease.start()
    deadline = time.monotonic() + backend.timeout
    while not decided.wait(0.01) and time.monotonic() < deadline:
        try:
            holder = lease.holder()
        except StoreUnavailable:
            break
        if holder is not None and holder.instance_id != config.instance_id:
            break
    return lease


def _forget_views() -> None:
    """Drop cached checks so the next call resolves again (a new table appeared)."""
    with _lock:
        _views.clear()


def _after_fork_in_child() -> None:
    # The parent's lease threads do not exist here and their deadlines would
    # freeze; the child resolves again (table if trusted, else its own lease).
    global _lock
    _lock = threading.RLock()
    _views.clear()
    _local_leases.clear()
    _local_backends.clear()


def _stop_local_leases() -> None:
    # Release at exit so another process takes over at once, not after the ttl.
    with _lock:
        leases = list(_local_leases.values())
        _local_leases.clear()
        _views.clear()
    for lease in leases:
        try:
            lease.stop()
        except Exception:  # best effort: the interpreter is exiting
            logger.debug("celery-leader: could not stop %r at exit", lease.election, exc_info=True)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_stop_local_leases)


# -- the follower path -------------------------------------------------------


def _follower(spec: LeaderOnly, app: Any) -> Any:
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
    config = config_of(app)
    election = config.worker_election if spec.election is None else spec.election
    if spec.on_follower == "skip":
        logger.info(
            "celery-leader: skipped %s[%s]: this worker does not lead %r",
            task.name,
            request.id,
            election,
        )
        raise Ignore()
    if spec.on_follower == "reject":
        logger.info(
            "celery-leader: requeued %s[%s]: this worker does not lead %r",
            task.name,
            request.id,
            election,
        )
        raise Reject(f"not the leader of {election!r}", requeue=True)
    raise _retry(task, request, spec, election, config)


def _retry(task: Any, request: Any, spec: LeaderOnly, election: str, config: LeaderConfig) -> Any:
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
    # Task.retry(max_retries=None) means "the task's default" (3), not "no
    # limit"; a limit no task reaches does mean it. retry() also stores the
    # value on the shared task object, where autoretry_for would pick it up
    # for the user's own retries: put back what was there.
    limit = sys.maxsize if spec.max_retries is None else spec.max_retries
    missing = object()
    saved = task.__dict__.get("override_max_retries", missing)
    try:
        return task.retry(countdown=countdown, max_retries=limit)
    finally:
        if saved is missing:
            task.__dict__.pop("override_max_retries", None)
        else:
            task.override_max_retries = saved


def _auto_install(sender: Any = None, **_: Any) -> None:
    """Add the worker bootsteps to a starting worker whose app has a ``@leader_only`` task.

    ``worker_init`` is sent after the worker imported the task modules and
    before it builds its bootstep blueprint from ``app.steps``. Workers of
    other apps in the same process are left alone.
    """
    if sender is not None and any(spec_of(t) is not None for t in sender.app.tasks.values()):
        from .worker import install

        install(sender.app)


def _open_table(**_: Any) -> None:
    """Map the worker's table as a pool process starts.

    Then a spawned process keeps its mapping even if the worker removes the
    file while shutting down.
    """
    _shared.process_table()
    _forget_views()


signals.worker_init.connect(_auto_install, weak=False, dispatch_uid="celery_leader.auto_install")
signals.worker_process_init.connect(
    _open_table, weak=False, dispatch_uid="celery_leader.open_table"
)
