"""django-celery-beat, gated on the beat election.

Set ``CELERY_BEAT_SCHEDULER = "celery_leader.contrib.django:LeaderDatabaseScheduler"``
(or pass ``-S celery_leader.contrib.django:LeaderDatabaseScheduler``). It is a
subclass of django-celery-beat's ``DatabaseScheduler``, so its admin still
treats the schedule as database-managed.

The lease store's run state is the truth of what was sent: django-celery-beat
writes ``last_run_at`` to its rows lazily (every few minutes), so after a
fail-over they are behind; a leader copies the stored state onto the rows, for
the admin to show, and never the other way round.

Rows are edited at runtime, and an edit means what it means for every entry
(:class:`~celery_leader.schedule.jobs.Job`): a row's generation is its primary
key, so a row deleted and re-created under its name starts fresh; a row that
appears (created, re-enabled, past its ``start_time``) or whose schedule changed
is active since the leader saw that, so it sends nothing from before. A row's
``headers`` may carry its own ``leader_missed_slots`` and
``leader_missed_slots_grace``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from ..exceptions import missing_extra
from ..schedule.jobs import Job
from ..schedule.series import utc
from .beat import ENTRY_OPTIONS, LeaderSchedulerMixin

try:
    from celery import schedules
    from django_celery_beat.models import PeriodicTask
    from django_celery_beat.schedulers import DatabaseScheduler, ModelEntry
    from kombu.utils.json import dumps
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "django") from None

logger = logging.getLogger(__name__)


class LeaderModelEntry(ModelEntry):  # type: ignore[misc]
    """django-celery-beat's entry of a row, whose ``headers`` may hold its missed-slot policy.

    ``{"leader_missed_slots": "all", "leader_missed_slots_grace": 600}`` in a row's
    headers become the entry's options of those names (as in ``beat_schedule``),
    so they are not sent as message headers.
    """

    def __init__(self, model: Any, app: Any = None) -> None:
        super().__init__(model, app=app)
        headers = self.options.get("headers")
        if isinstance(headers, dict):
            for key in ENTRY_OPTIONS:
                if key in headers:
                    self.options[key] = headers.pop(key)

    @classmethod
    def from_entry(cls, name: str, app: Any = None, **entry: Any) -> LeaderModelEntry:
        """The row of code entry ``name`` (``beat_schedule``), written only when it differs.

        django-celery-beat's own ``from_entry`` saves the row and its schedule row
        even when nothing changed: each save tells every beat that the schedule
        changed, and a newly elected leader then reads all the tables again
        before its first slot (twice: once per entry written). Comparing first
        costs a few reads and writes nothing on a restart or a promotion.
        """
        row = cls._same_row(name, entry)
        if row is not None:
            return cls(row, app=app)
        return super().from_entry(name, app=app, **entry)  # type: ignore[no-any-return]

    @classmethod
    def _same_row(cls, name: str, entry: dict[str, Any]) -> Any:
        """The saved row of ``name`` when it already holds ``entry``, else None.

        The fields are django-celery-beat's ``_unpack_fields``, built without its
        ``to_model_schedule``, which saves the schedule row.
        """
        entry = dict(entry)
        schedule = schedules.maybe_schedule(entry.pop("schedule", None))
        linked: dict[str, Any] = {field: None for _, _, field in cls.model_schedules}
        for schedule_type, model_type, field in cls.model_schedules:
            if isinstance(schedule, schedule_type):
                # from_schedule reads the matching schedule row or builds an unsaved one.
                linked[field] = model_type.from_schedule(schedule)
                break
        else:
            return None  # not convertible: django-celery-beat reports it
        if any(model is not None and model.pk is None for model in linked.values()):
            return None  # a new schedule row: that is a write
        entry.pop("relative", None)
        args, kwargs = entry.pop("args", None), entry.pop("kwargs", None)
        options = entry.pop("options", None) or {}
        fields = {
            **entry,
            **linked,
            "args": dumps(args or []),  # type: ignore[no-untyped-call]
            "kwargs": dumps(kwargs or {}),  # type: ignore[no-untyped-call]
            **cls._unpack_options(**options),
        }
        row = PeriodicTask._default_manager.filter(name=name).first()
        if row is None:
            return None
        missing = object()
        for key, value in fields.items():
            if key in linked:  # compare keys: reading the related row is a query
                same = getattr(row, f"{key}_id", missing) == (value.pk if value else None)
            else:
                same = getattr(row, key, missing) == value
            if not same:
                return None
        return row

    def save(self) -> None:
        """Write the row's ``last_run_at`` and ``total_run_count``, and nothing else.

        django-celery-beat's own save reads the row and saves all of it: an edit
        committed in between is undone (a disabled row enabled again) or a deleted
        row comes back (Django inserts when its update matched nothing). One
        ``UPDATE`` of two columns does neither, and leaves ``date_changed`` alone.
        """
        model = self.model
        type(model)._default_manager.filter(pk=model.pk).update(
            last_run_at=model.last_run_at, total_run_count=model.total_run_count
        )


@dataclass(frozen=True)
class _Seen:
    """What the leader last saw of a row: which row, its schedule, since when it counts."""

    generation: str
    schedule: object
    active_since: datetime | None


class LeaderDatabaseScheduler(LeaderSchedulerMixin, DatabaseScheduler):  # type: ignore[misc]
    """django-celery-beat's ``DatabaseScheduler``; only the elected replica dispatches."""

    Entry = LeaderModelEntry

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The rows as this replica saw them while leading, and when; None: not yet.
        self._rows: dict[str, _Seen] | None = None
        self._looked_at: datetime | None = None
        self._warmed = False  # the tables were read once ahead of leading
        # When a row next starts or expires (None: none will), and whether the rows
        # must be listed again (a one-off row ran, or leading stopped): either
        # changes which rows run, or since when, without a new schedule.
        self._turns_at: datetime | None = None
        self._relist = False
        super().__init__(*args, **kwargs)

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
            # The change mark first: an edit saved during or after the read moves it.
            mark = self.Changes.last_change()
            self.schedule  # noqa: B018 - the property reads the tables
        except Exception as exc:  # the leader's first tick reads again and reports
            logger.debug("celery-leader: reading the schedule ahead failed: %s", exc)
            return
        # django-celery-beat trusts its first read until the mark moves past the
        # one it saw last, and sees none at its first read: without this, a
        # replica promoted after rows were edited would dispatch the rows as
        # they were at its start (and no promotion writes rows to move it).
        if mark is None:
            self._initial_read = True  # nothing edited yet: the leader reads again
        else:
            self._last_timestamp = mark

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

    def schedule_moved(self) -> bool:
        """Whether a row started or expired, a one-off row ran, or leading stopped since the
        jobs were listed."""
        turns_at = self._turns_at
        return self._relist or (turns_at is not None and self.app.now() >= turns_at)

    def _next_turn(self, entries: Any) -> datetime | None:
        """The next instant a row's ``start_time`` or ``expires`` passes."""
        now = self.app.now()
        turns = [
            moment
            for entry in entries.values()
            for moment in (entry.model.start_time, entry.model.expires)
            if moment is not None and moment > now
        ]
        return min(turns, default=None)

    def mark_edits(self, jobs: list[Job]) -> list[Job]:
        """Each row's job with its generation (the row's key) and ``active_since``.

        A row is compared with what this replica saw at its previous look, by its
        schedule's value, not by ``date_changed``: django-celery-beat's own saves
        of ``last_run_at`` bump that. A row that appeared or changed since is
        active since its ``date_changed`` (the edit's save), kept between the
        previous look and now: the editor's clock may be off, and the edit
        happened in between. What a replica sees at its first look as leader it
        takes as it is (``active_since`` unset): the lease store keeps the
        ``active_since`` its predecessor recorded.
        """
        previous, looked_at = self._rows, self._looked_at
        # Not read at the first look, which needs no time: the clock may be the
        # store's, and reading it joins the election.
        protocol = self._protocol
        now = None if previous is None else (protocol.clock or protocol.now)()
        # Read once: each read of django-celery-beat's ``schedule`` asks the database
        # whether it changed, and may rebuild it.
        entries = self.schedule
        self._turns_at, self._relist = self._next_turn(entries), False
        rows, marked = {}, []
        for job in jobs:
            entry = entries.get(job.payload)
            if entry is None:  # deleted since the jobs were listed: gone at the next tick
                continue
            model = entry.model
            generation = f"row-{model.pk}"
            schedule = job.series.key() if job.series is not None else repr(entry.schedule)
            seen = None if previous is None else previous.get(job.name)
            if previous is None or now is None:
                since = None  # the first look: nothing to compare with
            elif seen is not None and (seen.generation, seen.schedule) == (generation, schedule):
                since = seen.active_since
            else:  # appeared (created, re-enabled, started), re-created or re-timed
                changed = now if model.date_changed is None else utc(model.date_changed)
                since = min(changed if looked_at is None else max(changed, looked_at), now)
            rows[job.name] = _Seen(generation, schedule, since)
            marked.append(replace(job, generation=generation, active_since=since))
        self._rows, self._looked_at = rows, now
        return marked

    def stopped_leading(self) -> None:
        """Forget the rows: edits made while following were not watched."""
        super().stopped_leading()
        self._rows = self._looked_at = None
        self._relist = True  # a promotion's first look takes the rows as they are

    def set_run_state(self, entry: Any, last_run_at: datetime, count: int) -> None:
        """Also update the entry's model row, which ``next(entry)`` copies from."""
        super().set_run_state(entry, last_run_at, count)
        entry.model.last_run_at = last_run_at
        entry.model.total_run_count = count
        if entry.model.one_off and count > 0:
            self._relist = True  # it runs no more: listed again without it
