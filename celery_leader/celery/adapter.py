"""Celery beat's entries and publish, as the slot protocol sees them: each
``ScheduleEntry`` becomes a :class:`~celery_leader.schedule.jobs.Job`, sent through
``Scheduler.apply_entry`` with the ``leader_epoch`` and ``leader_slot`` headers.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any

from ..exceptions import ConfigError, missing_extra
from ..schedule.catalog import EntryCatalog, kept_pause
from ..schedule.entries import LIMITS, Entry, EntryError, check_limit
from ..schedule.jobs import Adapter, Job, Outcome
from ..schedule.series import CronSeries, Every, Series, utc
from ..settings.config import OVERLAP, validate_grace, validate_missed_slots
from .publishing import BeatPublisher

try:
    from celery.beat import ScheduleEntry
    from celery.schedules import crontab, schedule
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

#: Entries from which the schedule built at start-up is left out of the garbage
#: collector's later scans (see :func:`keep_out_of_collections`); below, the
#: scans cost little and the process's garbage is left as Python handles it.
FREEZE_AT = 10_000

#: Entry options read by the scheduler, never passed on to ``apply_async``
#: (``overlap`` travels as the ``leader_overlap`` header, for the run ledger;
#: ``late_after`` and ``max_runtime`` are the console's alone).
ENTRY_OPTIONS = ("leader_missed_slots", "leader_missed_slots_grace", "overlap", *LIMITS)
_ENTRY_OPTIONS = frozenset(ENTRY_OPTIONS)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off (if it was on) while beat's schedule is built:
    scanning its millions of long-lived objects as they are made was half the build's time."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def keep_out_of_collections(size: int) -> None:
    """Collect what is garbage now, then leave everything alive out of later collections,
    when a schedule of ``size`` entries is large (``FREEZE_AT``) and the collector is on:
    each full collection scanned it all again (0.3 s at 300,000 entries)."""
    if gc.isenabled() and size >= FREEZE_AT:
        gc.collect()
        gc.freeze()


class BeatAdapter(Adapter):
    """Celery's entries and publish, as the slot protocol sees them."""

    def __init__(self, scheduler: Any, logger: logging.Logger) -> None:
        self.scheduler = scheduler
        config = scheduler.leader_config
        self.logger = logger
        self.catalog = EntryCatalog(config, logger, "task")
        # The confirm timeout is twice the tick timeout: a stalled publish must trip
        # the tick watchdog first, which hands the lead over at once. A confirm
        # timeout that ended the tick just before would let the next publish stall
        # on reconnecting, for another tick timeout before the watchdog fires.
        timeout = 2 * config.watchdog_timeout
        self.publisher = BeatPublisher(scheduler.app, timeout, scheduler.Producer)
        #: Code entries' jobs, by name, with the schedule and options they were made of:
        #: listing again reuses them, and a promotion finds them made (see ``__init__``).
        self._made: dict[str, tuple[Any, Any, Job]] = {}
        self._bad_options: set[str] = set()  # entries whose leader_* options were refused
        self._bad_limits: set[str] = set()  # entries whose late_after / max_runtime were
        #: The scheduler's ``schedule`` as the last :meth:`jobs` read it, and its size.
        self._entries: dict[str, ScheduleEntry] | None = None
        self._count = 0
        #: What the last :meth:`jobs` returned: returned again while nothing changed,
        #: made again first when edits were taken since (``_stale``).
        self._listed: list[Job] | None = None
        self._stale = False
        #: The code entries' jobs of that list, as marked, by name: an entry edited in
        #: place (:meth:`LeaderSchedulerMixin.edited_entries`) replaces only its own.
        self._code: dict[str, Job] = {}
        #: While a follower makes code entries' jobs a slice at a time: the schedule
        #: it walks, the entries left, and the series made so far.
        self._warming: tuple[dict[str, ScheduleEntry], Iterator[ScheduleEntry], Any] | None = None
        self._warmed: dict[str, ScheduleEntry] | None = None  # the schedule all made of

    def warm(self, budget: float) -> bool:
        """Make code entries' jobs for up to ``budget`` seconds, ahead of a promotion;
        True once every entry of beat's current ``schedule`` has its job made."""
        scheduler = self.scheduler
        entries = scheduler.schedule
        if self._warmed is entries:
            return True
        if self._warming is None or self._warming[0] is not entries:
            series = SeriesMemo(scheduler.leader_config.crontab_dst)
            self._warming = (entries, iter(list(entries.values())), series)
        _, left, series = self._warming
        records = self.catalog.last_read()
        zone, end = scheduler.app.timezone, time.monotonic() + budget
        now = self.catalog.now()
        with collector_paused():
            for entry in left:
                self._code_job(entry, records, zone, self._made, series, now)
                if time.monotonic() > end:
                    return False
        self._warming, self._warmed = None, entries
        keep_out_of_collections(len(entries))
        return True

    def jobs_changed(self) -> bool:
        """Whether beat's ``schedule`` is another dict or another size (Celery replaces an
        entry in place only with its own successor, of the same schedule), the store's
        entries were read again, or the scheduler says so."""
        entries = self._entries
        if entries is None:
            return True
        scheduler = self.scheduler
        current = scheduler.schedule
        return (
            current is not entries
            or len(current) != self._count
            or self.catalog.changed()
            or scheduler.schedule_moved()
        )

    def jobs(self) -> Sequence[Job]:
        # Listed at start-up or while leading before (a promotion), and changed at most in
        # the store's entries or the kept pauses: their edits taken, costing what changed.
        # A promotion while a million entries were still read page by page, or with an
        # edit not yet taken, made every entry's job again here (1.3 s).
        if self._listed is not None and (not self.jobs_changed() or self.job_edits() is not None):
            if self._stale:  # edits were taken since it was made
                self._listed = list(self._code.values()) + self.catalog.stored_jobs()
                self._stale = False
            return self._listed
        scheduler = self.scheduler
        scheduler.set_up_as_leader()
        zone = scheduler.app.timezone
        moved = self.catalog.changed()  # kept pauses of code entries among them, maybe
        records = self.catalog.read()
        now = self.catalog.now()
        self._list_code(records, zone, now, None, moved)
        stored = self.catalog.jobs(records, self._made, zone)
        self._listed, self._stale = list(self._code.values()) + stored, False
        return self._listed

    def jobs_complete(self) -> bool:
        return not self.catalog.loading()

    def job_edits(self) -> Mapping[str, Job | None] | None:
        """Only where beat's own ``schedule`` did not change (else ``None``): the jobs of the
        store's records that changed, and of code entries whose kept pause did."""
        entries = self._entries
        scheduler = self.scheduler
        if (
            self._listed is None
            or scheduler.schedule is not entries
            or len(entries) != self._count
            or scheduler.schedule_moved()
        ):
            return None
        zone = scheduler.app.timezone
        names, edits = self.catalog.job_edits(self._made, zone)
        code = names & entries.keys()
        if code:
            # A code entry paused or resumed: its job is made again, the others kept.
            before = {name: self._code.get(name) for name in code}
            self._list_code(self.catalog.last_read(), zone, self.catalog.now(), code, False)
            for name in code:
                job = self._code.get(name)
                if job is not before[name]:
                    edits[name] = job
        if edits:
            self._stale = True
        return edits

    def _list_code(
        self,
        records: dict[str, Entry],
        zone: Any,
        now: datetime,
        names: set[str] | None,
        everything: bool,
    ) -> None:
        """Make the jobs of beat's code entries into ``_code``: every one (``names``
        ``None``, and ``everything`` or the scheduler cannot tell what it edited), else
        those named and those the scheduler says it edited in place."""
        scheduler = self.scheduler
        entries_before = self._entries
        # Read once per pass: ``schedule`` may be a property that asks a database
        # whether the schedule changed (django-celery-beat's), far too slow per entry.
        entries: dict[str, ScheduleEntry] = scheduler.schedule
        self._entries = entries
        self._count = len(entries)
        series = SeriesMemo(scheduler.leader_config.crontab_dst)
        edited = scheduler.edited_entries()
        if names is None and (
            everything or edited is None or entries is not entries_before or self._listed is None
        ):
            first = self._listed is None
            made, self._made = self._made, {}
            with collector_paused():
                jobs = [
                    job
                    for entry in entries.values()
                    if (job := self._code_job(entry, records, zone, made, series, now))
                    is not None
                ]
            self._code = {job.name: job for job in scheduler.mark_edits(jobs)}
            if first and self._warmed is not entries:  # made here, not by warm()
                keep_out_of_collections(len(entries))
            self._warming, self._warmed = None, entries
            return
        # Only these entries changed: the others keep their jobs, so that a large
        # schedule costs an edit what the edit touched (the protocol skips a job
        # that is the one it holds).
        changed = set(names or ()) | set(edited or ())
        jobs = []
        for name in changed:
            self._code.pop(name, None)
            entry = entries.get(name)
            job = (
                None
                if entry is None
                else self._code_job(entry, records, zone, self._made, series, now)
            )
            if job is None:
                self._made.pop(name, None)
            else:
                jobs.append(job)
        self._code.update((job.name, job) for job in scheduler.mark_edits(jobs, changed))

    def run_requests(self) -> Mapping[str, str]:
        return self.catalog.requests()

    def run_job(self, name: str) -> Job | str:
        """A code entry's job, sent with its own options (``overlap`` included) through
        :meth:`send`, paused or not; else a store entry's, as the catalog allows it."""
        scheduler = self.scheduler
        zone = scheduler.app.timezone
        entries = self._entries or {}  # beat's schedule as listed: what send() looks in
        if name in entries:
            policy, grace = self._policy(entries[name])
            return Job(name, None, policy, grace, zone, name)
        return self.catalog.run_job(name, entries, zone)

    def _code_job(
        self,
        entry: ScheduleEntry,
        records: dict[str, Entry],
        zone: Any,
        made: dict[str, tuple[Any, Any, Job]],
        series: SeriesMemo,
        now: datetime,
    ) -> Job | None:
        """The job of beat's ``entry``, or None while it may not run at ``now``; reused
        from ``made`` when its schedule and options are the ones it was made of. Kept
        in ``_made``."""
        enabled, since = kept_pause(records, entry.name, now)
        if not self.scheduler.entry_enabled(entry) or not enabled:
            return None
        sched, options = entry.schedule, entry.options
        known = made.get(entry.name)
        if known is not None and known[0] is sched and known[1] is options:
            job = known[2]  # Celery's successor of a sent entry shares both
            if job.active_since != since or job.zone != zone:
                job = replace(job, zone=zone, active_since=since)
        else:
            policy, grace = self._policy(entry)
            self._check_limits(entry)
            job = Job(
                entry.name, series.of(sched), policy, grace, zone, entry.name, active_since=since
            )
        self._made[entry.name] = (sched, options, job)
        return job

    def _celery_entry(self, entry: Entry, due: datetime) -> ScheduleEntry:
        """A Celery entry that sends what ``entry`` names (never put in beat's schedule),
        last run at the slot it sends."""
        return ScheduleEntry(
            name=entry.name,
            last_run_at=due.astimezone(self.scheduler.app.timezone),
            task=entry.task,
            args=tuple(entry.args),
            kwargs=dict(entry.kwargs),
            options=dict(entry.options),
            app=self.scheduler.app,
        )

    def _policy(self, entry: ScheduleEntry) -> tuple[str, float | None]:
        """The missed-slot policy and grace of ``entry``: its options, else the settings."""
        config = self.scheduler.leader_config
        options = entry.options or {}
        if _ENTRY_OPTIONS.isdisjoint(options):
            return config.missed_slots, config.missed_slots_grace  # validated at start-up
        try:
            policy = validate_missed_slots(
                f"option leader_missed_slots of entry {entry.name!r}",
                options.get("leader_missed_slots", config.missed_slots),
            )
            grace = (
                validate_grace(
                    f"option leader_missed_slots_grace of entry {entry.name!r}",
                    options["leader_missed_slots_grace"],
                )
                if "leader_missed_slots_grace" in options
                else config.missed_slots_grace
            )
            if options.get("overlap", "allow") not in OVERLAP:
                raise ConfigError(
                    f"option overlap of entry {entry.name!r} must be one of "
                    f"{', '.join(OVERLAP)} (got {options['overlap']!r}); workers use "
                    "leader_overlap for it"
                )
        except ConfigError as exc:
            if entry.name not in self._bad_options:
                self._bad_options.add(entry.name)
                self.logger.error("celery-leader: %s; using the settings instead", exc)
            return config.missed_slots, config.missed_slots_grace
        return policy, grace

    def _check_limits(self, entry: ScheduleEntry) -> None:
        """Log once (and then ignore) a bad ``late_after`` or ``max_runtime`` option:
        they change nothing in dispatch."""
        options = entry.options or {}
        try:
            for limit in LIMITS:
                check_limit(f"option {limit} of entry {entry.name!r}", options.get(limit))
        except EntryError as exc:
            if entry.name not in self._bad_limits:
                self._bad_limits.add(entry.name)
                self.logger.error("celery-leader: %s; the console ignores it", exc)

    def _entry(self, job: Job) -> ScheduleEntry:
        # Looked up by name: reserve() replaces a sent entry with its successor
        # (in the same dict, which ``schedule`` returns every time it is unchanged).
        assert self._entries is not None, "a job is used only once listed"
        return self._entries[job.payload]

    def due_now(self, job: Job, now: datetime) -> tuple[datetime | None, float]:
        scheduler = self.scheduler
        entry = self._entry(job)
        try:
            is_due, next_time = scheduler.is_due(entry)
        except Exception:
            is_due, next_time = scheduler._is_due_failed(entry)
        if not is_due:
            return None, float(next_time)
        sched = entry.schedule
        if isinstance(sched, crontab) and entry.last_run_at is not None:
            # Celery's own due time (leader_crontab_dst = "celery"): computed from
            # last_run_at alone, so every replica names the slot alike.
            start, ends_in, _ = sched.remaining_delta(entry.last_run_at)
            return utc(start + ends_in), float(next_time)
        return now, float(next_time)

    def recorded(self, job: Job, last_run_at: datetime, count: int, sent: bool) -> None:
        scheduler = self.scheduler
        if isinstance(job.payload, Entry):
            return  # a store entry's: its Celery entry is made only to send it
        local = last_run_at.astimezone(scheduler.app.timezone)
        entry = self._entry(job)
        if sent:
            # Celery's own bookkeeping of a run (django-celery-beat saves its row).
            entry = scheduler.reserve(entry)
        scheduler.set_run_state(entry, local, count)

    def send(self, job: Job, slot: str, due: datetime, epoch: int) -> Outcome:
        payload = job.payload
        # A store entry's Celery entry is made for this send alone: a million of them
        # kept would weigh more than the rest of the schedule.
        entry = self._celery_entry(payload, due) if isinstance(payload, Entry) else self._entry(job)
        # Celery's apply_async reads the headers from entry.options; swap in a
        # copy for this one call so they never stick to the entry (or its model
        # row). Entries are not copied: django-celery-beat's cannot be.
        options = entry.options
        headers = {**options.get("headers", {}), "leader_epoch": epoch, "leader_slot": slot}
        if "overlap" in options:
            headers["leader_overlap"] = options["overlap"]
        kept = {k: v for k, v in options.items() if k not in _ENTRY_OPTIONS}
        entry.options = {**kept, "headers": headers}
        try:
            # apply_entry (not apply_async): code that hooks it, like
            # sentry-sdk's Crons integration, sees every slot.
            return self.publisher.send(
                lambda producer: self.scheduler.apply_entry(entry, producer=producer)
            )
        finally:
            entry.options = options

    def flush(self) -> Outcome:
        return self.publisher.flush()

    def expired(self, job: Job, age: float) -> bool:
        payload = job.payload
        options = payload.options if isinstance(payload, Entry) else self._entry(job).options
        expires = options.get("expires")  # Celery's: seconds after the publish, or a datetime
        if isinstance(expires, datetime):
            return expires.timestamp() <= time.time()
        return isinstance(expires, int | float) and not isinstance(expires, bool) and age >= expires

    def demoted(self) -> None:
        self.scheduler.stopped_leading()

    def publishing(self) -> AbstractContextManager[object]:
        """One claimed batch: publishes pipelined where they can be (stop signals are
        held back for the whole tick, see :meth:`LeaderSchedulerMixin.tick`)."""
        return self.publisher.pipelined()


class SeriesMemo:
    """The series of one listing pass, made once per distinct schedule (most entries of
    a large schedule share a few, by identity or by value)."""

    def __init__(self, crontab_dst: str) -> None:
        self.crontab_dst = crontab_dst
        #: By identity, the fastest; each schedule held, so that its id is not reused.
        self._by_id: dict[int, tuple[Any, Series | None]] = {}
        self._by_value: dict[tuple[Any, ...], Series | None] = {}

    def of(self, sched: Any) -> Series | None:
        """The series of ``sched``: the one made for it or an equal schedule, else a new one."""
        known = self._by_id.get(id(sched))
        if known is not None:
            return known[1]
        key = _series_key(sched)
        if key is None:
            series = series_of(sched, self.crontab_dst)
        elif key in self._by_value:
            series = self._by_value[key]
        else:
            series = self._by_value[key] = series_of(sched, self.crontab_dst)
        self._by_id[id(sched)] = (sched, series)
        return series


def _series_key(sched: Any) -> tuple[Any, ...] | None:
    """All that :func:`series_of` reads of ``sched``, by value (``None``: not shared)."""
    if type(sched) is schedule:
        return ("every", sched.run_every, sched.relative)
    if isinstance(sched, crontab):
        return (
            "cron",
            sched.tz,
            frozenset(sched.minute),
            frozenset(sched.hour),
            frozenset(sched.day_of_month),
            frozenset(sched.month_of_year),
            frozenset(sched.day_of_week),
        )
    return None


def series_of(sched: Any, crontab_dst: str = "cron") -> Series | None:
    """The due instants of a Celery schedule, or ``None`` when only its ``is_due`` can tell
    (interval subclasses that override ``is_due`` keep their own rule)."""
    if isinstance(sched, crontab):
        # Subclasses included: django-celery-beat's TzAwareCrontab overrides
        # is_due only to read last_run_at in its own zone, which ``sched.tz`` is.
        if crontab_dst != "cron":
            return None
        return CronSeries(
            sched.tz,
            sched.minute,
            sched.hour,
            sched.day_of_month,
            sched.month_of_year,
            sched.day_of_week,
        )
    if (
        isinstance(sched, schedule)
        and type(sched).is_due is schedule.is_due
        and not sched.relative
        and sched.run_every.total_seconds() > 0
    ):
        return Every(sched.run_every)
    return None
