"""celery-leader: leader election for Celery beat and workers."""

from __future__ import annotations

from .beat import LeaderScheduler, LeaderSchedulerMixin
from .config import LeaderConfig
from .decorators import is_leader, leader_only
from .exceptions import ConfigError, LeaderError, StoreUnavailable
from .lease import Lease
from .worker import install

__all__ = [
    "ConfigError",
    "LeaderConfig",
    "LeaderError",
    "LeaderScheduler",
    "LeaderSchedulerMixin",
    "Lease",
    "StoreUnavailable",
    "install",
    "is_leader",
    "leader_only",
]
__version__ = "0.1.0"
