"""celery-leader: leader election for Celery beat and workers (and Dramatiq).

The Celery parts are imported on first use, so that ``import celery_leader`` works
without Celery (using one of them then fails in one line naming the extra).
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

from .election.lease import Lease
from .election.lease_set import leader_of
from .exceptions import ConfigError, LeaderError, MissingExtra, NotLeader, StoreUnavailable
from .run.leadership import LeaderLoop, Leadership, leader_loop
from .settings.config import LeaderConfig

if TYPE_CHECKING:
    from .celery.beat import LeaderScheduler, LeaderSchedulerMixin
    from .celery.decorators import leader_only
    from .celery.leadership import current_epoch, ensure_leader, is_leader
    from .celery.routing import leader_queue
    from .celery.worker import install, install_worker_steps

#: Public name -> module that defines it, for the names that need Celery.
_CELERY_NAMES = {
    "LeaderScheduler": ".celery.beat",
    "LeaderSchedulerMixin": ".celery.beat",
    "current_epoch": ".celery.leadership",
    "ensure_leader": ".celery.leadership",
    "is_leader": ".celery.leadership",
    "leader_only": ".celery.decorators",
    "leader_queue": ".celery.routing",
    "install": ".celery.worker",
    "install_worker_steps": ".celery.worker",
}


def __getattr__(name: str) -> Any:
    module = _CELERY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "ConfigError",
    "LeaderConfig",
    "LeaderError",
    "LeaderLoop",
    "LeaderScheduler",
    "LeaderSchedulerMixin",
    "Leadership",
    "Lease",
    "MissingExtra",
    "NotLeader",
    "StoreUnavailable",
    "current_epoch",
    "ensure_leader",
    "install",
    "install_worker_steps",
    "is_leader",
    "leader_loop",
    "leader_of",
    "leader_only",
    "leader_queue",
]
#: The installed distribution's version: pyproject.toml is its one source.
__version__ = metadata.version("celery-leader")
