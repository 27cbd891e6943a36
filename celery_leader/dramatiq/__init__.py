"""Dramatiq support: one scheduler across replicas, leader-only actors, no Celery needed.

::

    broker.add_middleware(LeaderMiddleware(url="redis://redis:6379/1", ttl=15))

    @dramatiq.actor(leader_schedule=cron("30 2 * * *", tz="Europe/Berlin"))
    def nightly(): ...

    @dramatiq.actor(queue_name="leader", leader_only=True)  # only the leader consumes it
    def rebuild_index(): ...

See docs/dramatiq.md.
"""

from __future__ import annotations

from ..exceptions import missing_extra

try:  # once for every module of this package: each imports Dramatiq
    import dramatiq  # noqa: F401
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "dramatiq") from None

from .actors import LeaderActorError
from .middleware import LeaderMiddleware, current_epoch, is_leader
from .schedules import Schedule, cron, every

__all__ = [
    "LeaderActorError",
    "LeaderMiddleware",
    "Schedule",
    "cron",
    "current_epoch",
    "every",
    "is_leader",
]
