"""Celery workers run each beat-sent slot once: the run ledger's worker step.

With ``leader_ledger`` on (the default, where the app's settings resolve), a
starting worker wraps every task's ``before_start``: a message carrying
``leader_slot`` records its slot started, and a delivery of a slot that started
or finished already raises ``Ignore``; ``task_postrun`` records the outcome.
Loaded by the ``celery`` command through the ``celery.commands`` entry point.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

from ..exceptions import ConfigError, MissingExtra, missing_extra
from ..ledger import RunGuard, crons, step
from ..ledger.records import SKIPPED, SUCCESS
from ..probes import metrics
from . import leadership

try:
    from celery import signals, states
    from celery.exceptions import Ignore
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

logger = logging.getLogger(__name__)

#: Marks a task class whose ``before_start`` is wrapped already.
_WRAPPED = "_celery_leader_ledger"

#: (app, pid) -> the guard of that app in that process: pool children build their own.
_guards: dict[tuple[int, int], RunGuard] = {}


def slot_of(request: Any) -> str | None:
    """The ``leader_slot`` header of a task request, if it carries one."""
    slot = _header(request, "leader_slot")
    return slot if isinstance(slot, str) and slot else None


def _header(request: Any, name: str) -> Any:
    # Celery puts a message's own headers on the request; older paths keep them apart.
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def guard_of(app: Any) -> RunGuard:
    """This process's run guard for ``app`` (built on first use, after any fork)."""
    key = (id(app), os.getpid())
    guard = _guards.get(key)
    if guard is None:
        config = leadership.config_of(app)
        guard = _guards[key] = step.build_guard(config)
    return guard


def wrap_tasks(app: Any) -> int:
    """Wrap the ``before_start`` of every task class of ``app``; how many were new."""
    wrapped = 0
    for task in list(app.tasks.values()):
        cls = type(task)
        if cls.__dict__.get(_WRAPPED) or cls.__module__.startswith("celery."):
            continue  # Celery's own (chord unlock, backend cleanup ...) carry no slot
        cls.before_start = _before_start(cls.before_start)
        setattr(cls, _WRAPPED, True)
        # A tracer built before captured the old hook: build it again on first use.
        task.__trace__ = None
        wrapped += 1
    return wrapped


def _before_start(original: Any) -> Any:
    @functools.wraps(original)
    def before_start(self: Any, task_id: str, args: Any, kwargs: Any) -> Any:
        slot = slot_of(self.request)
        if slot is not None:
            _begin(self, slot)
        return original(self, task_id, args, kwargs)

    return before_start


def _begin(task: Any, slot: str) -> None:
    guard = guard_of(task.app)
    config = leadership.config_of(task.app)
    retry = bool(getattr(task.request, "retries", 0))
    overlap, epoch = _header(task.request, "leader_overlap"), _header(task.request, "leader_epoch")
    decision = step.begin(guard, config, slot, retry, overlap, epoch)
    if decision is None:
        return  # unrecorded beats unrun
    if not decision.run:
        raise Ignore()
    # Only the delivery that runs the body records its end: with a thread pool a
    # duplicate of a running slot ends in the same process.
    task.request.leader_ledger_runs = True


def _on_postrun(sender: Any = None, task: Any = None, state: str | None = None, **_: Any) -> None:
    task = task or sender
    if task is None or not getattr(type(task), _WRAPPED, False):
        return
    slot = slot_of(task.request)
    if slot is None or not getattr(task.request, "leader_ledger_runs", False):
        return
    guard = _guards.get((id(task.app), os.getpid()))
    if guard is None:
        return
    if state == states.SUCCESS:
        guard.finish(slot, SUCCESS)
    elif state == states.FAILURE:
        step.failed(guard, slot)
    elif state == states.IGNORED:
        guard.finish(slot, SKIPPED)  # the body itself ignored it (a follower's @leader_only)
    else:
        guard.release(slot)  # a retry or a requeue: the next delivery takes it over


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    if sender is None:
        return
    app = sender.app
    chosen = _ledger_setting(app)
    if chosen is not None and str(chosen).strip().lower() in ("0", "false", "no", "off", ""):
        return
    try:
        config = leadership.config_of(app)
    except ConfigError as exc:
        if chosen is None:
            # The default, in an app celery-leader cannot serve (no store to
            # write to): its beat cannot send slots either, so nothing to guard.
            logger.debug("celery-leader: run ledger off: %s", exc)
            return
        print(f"celery-leader: cannot start worker {sender.hostname}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    if not config.ledger:
        return
    if config.metrics_port is not None:
        _serve_metrics(config.metrics_port, sender.hostname)
    if config.sentry_crons:
        try:
            crons.require()
        except ConfigError as exc:
            print(f"celery-leader: cannot start worker {sender.hostname}: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    try:
        step.register(config, sender.hostname)
    except ConfigError as exc:  # the store cannot be built (StoreMisconfigured is one)
        if chosen is None:
            logger.debug("celery-leader: run ledger off: %s", exc)
            return
        print(f"celery-leader: cannot start worker {sender.hostname}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    count = wrap_tasks(app)
    worker = sender

    def say() -> None:
        logger.info(
            "celery-leader: run ledger on (%d task(s); a dead worker's slot: %s)",
            count,
            config.on_redelivery,
        )

    def announce(sender: Any = None, instance: Any = None, **_: Any) -> None:
        # `celery worker` sets its logging up after worker_init, where a line
        # logged goes nowhere; this signal comes once it is set up, before the
        # banner. It is sent for every worker of the process: say it for this one.
        if instance is not worker:
            return
        signals.celeryd_after_setup.disconnect(announce)
        say()

    from celery.apps.worker import Worker

    if isinstance(worker, Worker):
        signals.celeryd_after_setup.connect(announce, weak=False)
    else:
        # Only `celery worker`'s Worker sends celeryd_after_setup; another
        # (start_worker, a WorkController of one's own) has its logging set up
        # by its caller already, and a receiver would wait for it for ever.
        say()


def _serve_metrics(port: int, hostname: str) -> None:
    """Serve this worker's metrics from its main process, with what its pool counts
    (into a file this process reads at each scrape)."""
    try:
        metrics.serve(port)
        metrics.share_with_pool()
    except (MissingExtra, OSError) as exc:
        print(
            f"celery-leader: cannot start worker {hostname}: leader_metrics_port: {exc}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def _ledger_setting(app: Any) -> Any:
    """``leader_ledger`` as the app sets it (``None``: unset, so on by default), read
    before building the whole config: an app whose settings celery-leader cannot
    resolve keeps a worker that starts as before."""
    prefix = getattr(app, "namespace", None)
    name = f"{prefix}_LEADER_LEDGER" if prefix else "leader_ledger"
    return app.conf.get(name)


signals.worker_init.connect(
    _on_worker_init, weak=False, dispatch_uid="celery_leader.ledger.worker_init"
)
signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="celery_leader.ledger.postrun")
