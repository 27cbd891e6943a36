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

import logging
from datetime import datetime
from typing import Any

from ..exceptions import missing_extra
from .beat import LeaderSchedulerMixin

try:
    from django_celery_beat.schedulers import DatabaseScheduler
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "django") from None

logger = logging.getLogger(__name__)


class LeaderDatabaseScheduler(LeaderSchedulerMixin, DatabaseScheduler):  # type: ignore[misc]
    """django-celery-beat's ``DatabaseScheduler``; only the elected replica dispatches."""

    _warmed = False

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One scheduler pass; the first one also reads the schedule tables (see below)."""
        if not self._warmed:
            self._warmed = True
            self._warm_up()
        return super().tick(*args, **kwargs)

    def _warm_up(self) -> None:
        """Read the schedule tables once, as a follower may: without writing.

        The first read of a process is slow (Django opens its connection and
        builds its queries, django-celery-beat builds every entry): measured
        at most of a second on a busy machine, which a promotion would add to
        the hand-over. Writing stays a leader's: ``setup_schedule`` (which
        saves ``beat_schedule`` into the tables) still waits for the lease.
        """
        try:
            self.schedule  # noqa: B018 - the property reads the tables
        except Exception as exc:  # the leader's first tick reads again and reports
            logger.debug("celery-leader: reading the schedule ahead failed: %s", exc)

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
