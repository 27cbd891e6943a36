"""Where the scheduler runs: ``python -m celery_leader.dramatiq MODULE`` or a ``dramatiq`` fork
(which also exits within one interval when ``dramatiq``'s main process dies)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from dramatiq.cli import import_broker, make_argument_parser

from ..exceptions import ConfigError
from ..settings.config import LeaderConfig
from .cli_errors import one_line_errors
from .pika_logs import quiet_connect_errors
from .scheduler import DramatiqScheduler

logger = logging.getLogger(__name__)


def standalone(argv: Sequence[str] | None = None) -> int:
    """``python -m celery_leader.dramatiq MODULE [MODULE ...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m celery_leader.dramatiq",
        description="Run the celery-leader scheduler for the actors of a Dramatiq app.",
    )
    parser.add_argument("broker", help="module (or module:broker) that sets up the broker")
    parser.add_argument("modules", nargs="*", help="more modules that declare actors")
    parser.add_argument("--path", "-P", action="append", default=[], help="add to sys.path")
    parser.add_argument("--log-level", default="INFO", help="default: INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="[%(asctime)s] [PID %(process)d] [%(threadName)s] [%(name)s] [%(levelname)s] "
        "%(message)s",
    )
    sys.path[:0] = [*args.path, os.getcwd()]
    try:
        return _run(args.broker, args.modules, parent_pid=None)
    except ConfigError as exc:
        print(f"celery-leader: {exc}", file=sys.stderr)
        return 2


@one_line_errors
def embedded_scheduler() -> int:
    """The fork function of ``LeaderMiddleware(scheduler=True)``: reads ``dramatiq``'s own argv."""
    args = make_argument_parser().parse_args()  # type: ignore[no-untyped-call]
    sys.path[:0] = list(args.path)
    return _run(args.broker, args.modules, parent_pid=os.getppid())


def _run(broker_path: str, modules: Sequence[str], parent_pid: int | None) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Only set a flag: a second SIGTERM (group delivery plus Dramatiq's
        # relay) must not interrupt the hand-over.
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    broker, config = load_app(broker_path, modules)
    quiet_connect_errors(broker)
    if not any(actor.options.get("leader_schedule") for actor in broker.actors.values()):
        # A leader that sends nothing would keep the replicas that have the
        # schedules from sending: stay out of the election instead.
        logger.warning(
            "celery-leader: no actor with a leader_schedule in %s: this scheduler stays out "
            "of %r (import the modules that declare them: %s MODULE [MODULE ...])",
            " ".join([broker_path, *modules]),
            config.beat_election,
            "dramatiq" if parent_pid else "python -m celery_leader.dramatiq",
        )
        _idle(stop, parent_pid)
        return 0
    DramatiqScheduler(broker, config).run(stop, parent_pid)
    return 0


def load_app(broker_path: str, modules: Sequence[str]) -> tuple[Any, LeaderConfig]:
    """Import the broker module (as ``dramatiq MODULE`` does) and ``modules``; return the
    broker and the settings of its :class:`LeaderMiddleware`."""
    _, broker = import_broker(broker_path)  # type: ignore[no-untyped-call]
    for module in modules:
        importlib.import_module(module)
    config = settings_of(broker)
    if config is None:
        raise ConfigError(
            "the broker has no LeaderMiddleware: broker.add_middleware(LeaderMiddleware(...))"
        )
    return broker, config


def settings_of(broker: Any) -> LeaderConfig | None:
    """The settings of ``broker``'s ``LeaderMiddleware`` in this process, if it has one
    (found by its ``process_config()``: this module, its fork, does not import it)."""
    for middleware in broker.middleware:
        process_config = getattr(middleware, "process_config", None)
        if callable(process_config):
            config: LeaderConfig = process_config()
            return config
    return None


def _idle(stop: threading.Event, parent_pid: int | None) -> None:
    """Wait for the stop signal (or, in a fork, for ``dramatiq``'s main process to die)."""
    while not stop.wait(1.0):
        if parent_pid is not None and os.getppid() != parent_pid:
            return
