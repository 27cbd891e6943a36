"""``python -m celery_leader plan MODULE``: the Dramatiq side of ``leader plan`` (the
scheduler's own :func:`~celery_leader.dramatiq.scheduler.entries_of`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..exceptions import ConfigError
from ..schedule.jobs import Job
from ..settings.config import LeaderConfig
from .runner import load_app
from .scheduler import entries_of, leader_jobs


def app_jobs(
    broker_path: str, modules: Sequence[str], paths: Sequence[str], stored: bool = False
) -> tuple[Sequence[Job], LeaderConfig]:
    """The scheduled entries of the Dramatiq app in ``broker_path`` (and ``modules``), and
    the settings of its ``LeaderMiddleware``. ``paths`` go first on ``sys.path``.
    ``stored``: also the entries kept in the store (else nothing contacts it)."""
    sys.path[:0] = [*paths, os.getcwd()]
    try:
        broker, config = load_app(broker_path, modules)
    except ModuleNotFoundError as exc:
        named = [broker_path.partition(":")[0], *modules]
        if not any(exc.name and (m == exc.name or m.startswith(exc.name + ".")) for m in named):
            raise  # a module that the app itself imports: its traceback says where
        raise ConfigError(f"cannot import {exc.name!r}: no such module (see --path)") from None
    return (leader_jobs(broker, config) if stored else entries_of(broker, config)), config
