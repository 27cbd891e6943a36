"""celery-leader: leader election for Celery beat and workers."""

from __future__ import annotations

from .beat import LeaderScheduler, LeaderSchedulerMixin
from .config import LeaderConfig
from .exceptions import ConfigError, LeaderError, StoreUnavailable
from .lease import Lease

__all__ = [
    "ConfigError",
    "LeaderConfig",
    "LeaderError",
    "LeaderScheduler",
    "LeaderSchedulerMixin",
    "Lease",
    "StoreUnavailable",
]
__version__ = "0.1.0"
