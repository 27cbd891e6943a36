"""``celery_leader.contrib.django:LeaderDatabaseScheduler``, the path users type: the
scheduler lives in :mod:`celery_leader.celery.django`."""

from __future__ import annotations

from ..celery.django import LeaderDatabaseScheduler

__all__ = ["LeaderDatabaseScheduler"]
