"""django-celery-beat, gated on the beat election (``LeaderDatabaseScheduler``).

The lease store's run state is the truth of what was sent: django-celery-beat
writes ``last_run_at`` to its rows lazily, so a leader copies the stored state
onto the rows, never the other way round. A row's generation is its primary key.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from ..exceptions import missing_extra
from ..schedule.jobs import Job
from ..schedule.series import utc
from .adapter import ENTRY_OPTIONS
from .beat import LeaderSchedulerMixin

try:
    from celery import schedules
    from django.db import DatabaseError, InterfaceError  # type: ignore[import-untyped, unused-ignore]
    from django_celery_beat.models import PeriodicTask
    from django_celery_beat.schedulers import (
        SCHEDULE_SYNC_MAX_INTERVAL,
        DatabaseScheduler,
        ModelEntry,
    )
    from kombu.utils.json import dumps
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "django") from None

logger = logging.getLogger(__name__)

#: How long before the previous change mark a changed row's ``date_changed`` may
#: lie and still be read again: an editor whose clock runs behind, or whose
#: transaction commits long after its ``save()``, writes a ``date_changed`` older
#: than the mark it moves.
EDIT_MARGIN = timedelta(seconds=60)

#: Rows changed at once above this share of the schedule are read with the rest:
#: one full read costs the same and sees everything.
RELOAD_SHARE = 0.5

#: Rows read per query by their keys: under SQLite's oldest limit of 999 parameters.
CHUNK = 900

#: Keys of a schedule table's row: (the task's field naming that table, its pk).
_ScheduleKey = tuple[str, Any]


class LeaderModelEntry(ModelEntry):  # type: ignore[misc]
    """django-celery-beat's entry of a row, whose ``headers`` may hold its missed-slot
    policy: taken out as entry options (as in ``beat_schedule``), never sent."""

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

        django-celery-beat's own saves even when nothing changed, and each save
        makes a newly elected leader read all the tables again before its first slot.
        """
        row = cls._same_row(name, entry)
        if row is not None:
            return cls(row, app=app)
        return super().from_entry(name, app=app, **entry)  # type: ignore[no-any-return]

    @classmethod
    def _same_row(cls, name: str, entry: dict[str, Any]) -> Any:
        """The saved row of ``name`` when it already holds ``entry``, else None (the
        fields of ``_unpack_fields``, without ``to_model_schedule``, which saves)."""
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

        django-celery-beat's own save of the whole row undoes an edit committed in
        between, or brings a deleted row back; this leaves ``date_changed`` alone too.
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
        # Names of the entries reloaded in place since the jobs were listed; None:
        # the schedule was read whole, every job is listed again.
        self._edited: set[str] | None = None
        # The schedule tables' rows (intervals, crontabs, ...) at the last read: an
        # edit of one re-times its tasks without touching their date_changed.
        self._schedule_rows: dict[_ScheduleKey, tuple[Any, ...]] = {}
        # Rows in the schedule whose entry could not be built: not read again until
        # they change, so they do not count as appeared at every look.
        self._unbuilt: set[Any] = set()
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
        """Read the schedule tables once, without writing: the first read of a process
        is slow, which a promotion would add to the hand-over."""
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

    @property  # the mixin declares it an attribute, as Celery's base scheduler has it
    def schedule(self) -> dict[str, Any]:  # type: ignore[override]
        """django-celery-beat's schedule, read whole once, then only where it changed
        (django-celery-beat reads every row at each edit: seconds at 100,000 rows)."""
        if self._initial_read or self._schedule is None:
            return self._read_all()
        previous = self._last_timestamp
        try:
            if self.schedule_changed():
                self._reload(previous)
            elif previous is None and self._last_timestamp is not None:
                self._read_all()  # the first edit ever: there is no mark to read after
            elif self._sync_due():
                self._reload(None)
        except (DatabaseError, InterfaceError) as exc:
            # Kept as it was; the mark is put back so that the next tick reads again.
            self._last_timestamp = previous
            logger.warning("celery-leader: reading the changed rows failed: %r", exc)
        return self._schedule  # type: ignore[no-any-return]

    def _read_all(self) -> dict[str, Any]:
        """Every row (django-celery-beat's own read), with the change mark and schedule
        tables read before it: an edit saved during the read moves the mark again."""
        mark = self.Changes.last_change()
        self._schedule_rows = self._read_schedule_rows()
        self._initial_read = True
        entries: dict[str, Any] = super().schedule
        self._last_timestamp = mark
        self._edited, self._unbuilt = None, set()
        return entries

    def _sync_due(self) -> bool:
        """Whether django-celery-beat's 5-minute resync is due (it reads every row; this
        only the keys, see :meth:`_reload`)."""
        since = datetime.now() - self._last_full_sync  # naive, as django-celery-beat's
        return bool(since.total_seconds() >= SCHEDULE_SYNC_MAX_INTERVAL)

    def _reload(self, mark: datetime | None) -> None:
        """Replace the entries of the rows changed since the change mark ``mark`` (None:
        the mark did not move), and of the rows that entered or left the schedule.

        The keys of the rows in the schedule find rows a bulk ``update()`` enabled,
        disabled or deleted (the admin's actions leave ``date_changed`` alone), and
        rows entering or leaving django-celery-beat's windows.
        """
        self.sync()  # our run state written first, as django-celery-beat does
        self._last_full_sync = datetime.now()
        entries = self._schedule
        held = {entry.model.pk: name for name, entry in entries.items()}
        present = set(self.enabled_models_qs().prefetch_related(None).values_list("pk", flat=True))
        changed: set[Any] = set()
        moved = False  # whether any row says why the mark moved
        if mark is not None:
            for pk, stamp in self.Model.objects.filter(
                date_changed__gte=mark - EDIT_MARGIN
            ).values_list("pk", "date_changed"):
                changed.add(pk)
                moved = moved or stamp >= mark
            moved = self._retimed(changed) or moved
        appeared = present - held.keys() - self._unbuilt
        left = held.keys() - present
        load = appeared | (changed & present)
        gone = left | (changed & held.keys())
        if mark is not None and not moved and not appeared and not left:
            # The mark moved and no row says why: a bulk update() of other columns,
            # or an editor whose clock is far behind. Read everything, as
            # django-celery-beat does.
            self._read_all()
            return
        if len(load) > RELOAD_SHARE * len(present):
            self._read_all()
            return
        edited = {held[pk] for pk in gone}
        for name in edited:
            entries.pop(name, None)
        unbuilt = {pk for pk in self._unbuilt if pk in present and pk not in load}
        keys = sorted(load)
        for first in range(0, len(keys), CHUNK):
            for model in self.enabled_models_qs().filter(pk__in=keys[first : first + CHUNK]):
                try:
                    entries[model.name] = self.Entry(model, app=self.app)
                except ValueError:  # not a valid schedule: left out, as django-celery-beat does
                    unbuilt.add(model.pk)
                    continue
                edited.add(model.name)
        self._unbuilt = unbuilt
        if self._edited is not None:
            self._edited |= edited

    def _read_schedule_rows(self) -> dict[_ScheduleKey, tuple[Any, ...]]:
        """Every row of the schedule tables, by (task field, pk)."""
        return {
            (field, values[0]): values
            for _, model, field in self.Entry.model_schedules
            for values in model._default_manager.values_list()
        }

    def _retimed(self, changed: set[Any]) -> bool:
        """Add to ``changed`` the rows of schedule table rows edited since the last read;
        whether there were any."""
        before, after = self._schedule_rows, self._read_schedule_rows()
        self._schedule_rows = after
        edited = [key for key in before.keys() | after.keys() if before.get(key) != after.get(key)]
        for field in {field for field, _ in edited}:
            pks = [pk for name, pk in edited if name == field]
            changed.update(
                self.Model.objects.filter(**{f"{field}_id__in": pks}).values_list("pk", flat=True)
            )
        return bool(edited)

    def edited_entries(self) -> set[str] | None:
        """The rows reloaded in place since the jobs were listed; None when every row is
        listed again: at the first look as leader, or when rows started or expired or a
        one-off row ran."""
        edited, self._edited = self._edited, set()
        if self._rows is None or self._relist or self._turned():
            return None
        return edited

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
        """Whether rows were reloaded, a row started or expired, a one-off row ran, or
        leading stopped since the jobs were listed."""
        return self._edited != set() or self._relist or self._turned()

    def _turned(self) -> bool:
        turns_at = self._turns_at
        return turns_at is not None and self.app.now() >= turns_at

    def _next_turn(self, entries: Iterable[Any]) -> datetime | None:
        """The next instant a row's ``start_time`` or ``expires`` passes."""
        now = self.app.now()
        turns = [
            moment
            for entry in entries
            for moment in (entry.model.start_time, entry.model.expires)
            if moment is not None and moment > now
        ]
        return min(turns, default=None)

    def mark_edits(self, jobs: list[Job], edited: set[str] | None = None) -> list[Job]:
        """Each row's job with its generation (the row's key) and ``active_since``.

        Rows are compared by schedule value, not ``date_changed`` (saves of
        ``last_run_at`` bump that). A row that appeared or changed is active since
        its ``date_changed``, kept between the previous look and now (the editor's
        clock may be off). The first look as leader sets no ``active_since``: the
        store keeps the predecessor's.
        """
        previous, looked_at = self._rows, self._looked_at
        # Not read at the first look, which needs no time: the clock may be the
        # store's, and reading it joins the election.
        protocol = self._protocol
        now = None if previous is None else (protocol.clock or protocol.now)()
        # The entries the jobs were made of (a read of ``schedule`` asks the database
        # whether it changed, and may change it).
        entries = self._schedule
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
        if edited is None or previous is None:
            self._turns_at, self._relist = self._next_turn(entries.values()), False
            self._rows = rows
        else:  # only ``edited`` listed again: the other rows are as seen before
            for name in edited:
                previous.pop(name, None)
            previous.update(rows)
            self._rows = previous
            turns = [self._turns_at, self._next_turn(entries[name] for name in rows)]
            self._turns_at = min((t for t in turns if t is not None), default=None)
        self._looked_at = now
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
