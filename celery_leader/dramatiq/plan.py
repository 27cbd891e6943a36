"""``python -m celery_leader plan MODULE``: the Dramatiq side of ``leader plan``.

Imports the app as the scheduler does and maps its scheduled actors onto
:class:`~celery_leader.schedule.jobs.Job` with the scheduler's own
:func:`~celery_leader.dramatiq.scheduler.entries_of`; the plan itself is
framework-free (:mod:`celery_leader.schedule.plan`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..config import LeaderConfig
from ..schedule.jobs import Job
from .runner import load_app
from .scheduler import entries_of


def app_jobs(
    broker_path: str, modules: Sequence[str], paths: Sequence[str]
) -> tuple[list[Job], LeaderConfig]:
    """The scheduled entries of the Dramatiq app in ``broker_path`` (and ``modules``), and
    the settings of its ``LeaderMiddleware``. ``paths`` go first on ``sys.path``."""
    sys.path[:0] = [*paths, os.getcwd()]
    broker, config = load_app(broker_path, modules)
    return entries_of(broker, config), config
