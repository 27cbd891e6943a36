"""django-celery-beat, gated on the beat election.

Set ``CELERY_BEAT_SCHEDULER = "celery_leader.contrib.django:LeaderDatabaseScheduler"``
(or pass ``-S celery_leader.contrib.django:LeaderDatabaseScheduler``). It is a
subclass of django-celery-beat's ``DatabaseScheduler``, so its admin still
treats the schedule as database-managed.

django-celery-beat writes ``last_run_at`` to its tables lazily (every few
minutes), so after a fail-over its rows are behind. The slot claims in the
lease store are what keep a slot from going out twice: before an entry is
considered due, its stored run state is adopted when newer than the row's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..exceptions import missing_extra
from .beat import LeaderSchedulerMixin

try:
    from django_celery_beat.schedulers import DatabaseScheduler
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "django") from None


class LeaderDatabaseScheduler(LeaderSchedulerMixin, DatabaseScheduler):  # type: ignore[misc]
    """django-celery-beat's ``DatabaseScheduler``; only the elected replica dispatches."""

    def entry_enabled(self, entry: Any) -> bool:
        """A row runs while enabled, after its ``start_time``, before it ``expires``, and
        a one-off row only until its first run (what django-celery-beat's ``is_due`` checks
        before its schedule)."""
        model = entry.model
        now = self.app.now()
        return bool(
            model.enabled
            and (model.start_time is None or now >= model.start_time)
            and (model.expires is None or now < model.expires)
            and not (model.one_off and model.total_run_count > 0)
        )

    def set_run_state(self, entry: Any, last_run_at: datetime, count: int) -> None:
        """Also update the entry's model row, which ``next(entry)`` copies from."""
        super().set_run_state(entry, last_run_at, count)
        entry.model.last_run_at = last_run_at
        entry.model.total_run_count = count
