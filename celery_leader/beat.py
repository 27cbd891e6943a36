"""``celery_leader.beat.LeaderScheduler``, the path users type: the scheduler lives in
:mod:`celery_leader.celery.beat`."""

from __future__ import annotations

from .celery.beat import LeaderScheduler, LeaderSchedulerMixin

__all__ = ["LeaderScheduler", "LeaderSchedulerMixin"]
