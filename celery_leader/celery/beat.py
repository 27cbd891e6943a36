"""Celery beat on every replica, one dispatcher, no schedule slot sent twice.

:class:`LeaderSchedulerMixin` gates any Celery scheduler on the beat election and
hands its dispatching to the slot protocol (:mod:`celery_leader.schedule`), which
it shares with the Dramatiq scheduler. This module only maps Celery onto it:

* each ``ScheduleEntry`` becomes a :class:`~celery_leader.schedule.jobs.Job`: an
  interval entry runs on a grid of its period since the Unix epoch, a crontab on
  :class:`~celery_leader.schedule.series.CronSeries` (cron's rules at clock
  changes; ``leader_crontab_dst = "celery"`` keeps Celery's own arithmetic),
  anything else (solar, custom schedules) on Celery's ``is_due``;
* a slot is sent through ``Scheduler.apply_entry`` with the ``leader_epoch`` and
  ``leader_slot`` headers, so code that hooks it (sentry-sdk's Crons) sees every
  slot; a failure is classified as "nothing reached the broker" or "unknown";
  the publishes of one claimed batch are pipelined where the broker allows it;
* stop signals are held back between a batch's claim and its publish.

A follower's ``tick()`` returns a short sleep and never runs Celery's own tick.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import metrics
from ..backends import open_store
from ..config import OVERLAP, validate_grace, validate_missed_slots
from ..exceptions import ConfigError, missing_extra
from ..schedule.entries import CODE, STORE, Entry, allowed
from ..schedule.feed import POLL_INTERVAL, EntryFeed
from ..schedule.jobs import Adapter, Job, Outcome
from ..schedule.protocol import SlotProtocol
from ..schedule.series import CronSeries, Every, Series, utc
from . import publishing, startup
from .signals import SIGNALS

try:
    from celery.beat import ScheduleEntry, Scheduler
    from celery.schedules import crontab, schedule
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

logger = logging.getLogger(__name__)

#: How often a follower's beat looks at its lease (a local clock compare, no
#: I/O). It bounds how long a promotion goes unnoticed, which is the part of
#: a hand-over that the lease does not decide: 0.1 s keeps a graceful
#: hand-over (release + wake-up + this) well under half a second.
FOLLOWER_INTERVAL = 0.1

#: Seconds of each follower tick (FOLLOWER_INTERVAL apart) spent making code
#: entries' jobs ahead of a promotion, until all are made: at most a fifth of a
#: core, so that replicas started together leave the CPU to the one elected,
#: which makes its jobs at once. Three replicas of 300,000 entries each made
#: them at start-up, side by side on two cores, before the first could send.
#: A promotion before the follower made them all makes the rest (under 1 s at
#: 300,000 entries).
WARM_SLICE = 0.02

#: Entries from which the schedule built at start-up is left out of the garbage
#: collector's later scans (see :func:`_keep_out_of_collections`); below, the
#: scans cost little and the process's garbage is left as Python handles it.
FREEZE_AT = 10_000

#: Entry options read by the scheduler, never passed on to ``apply_async``
#: (``overlap`` travels as the ``leader_overlap`` header, for the run ledger).
ENTRY_OPTIONS = ("leader_missed_slots", "leader_missed_slots_grace", "overlap")
_ENTRY_OPTIONS = frozenset(ENTRY_OPTIONS)


class LeaderSchedulerMixin:
    """Put first in the bases of a Celery scheduler to gate it on a lease.

    ``class MyScheduler(LeaderSchedulerMixin, SomeScheduler): ...``. The
    lease is created on the first ``tick()``, not in ``__init__``: beat builds
    its scheduler once more just to print the banner.
    """

    # Attributes of the Scheduler this mixes into, for the type checker.
    app: Any
    max_interval: float
    schedule: dict[str, ScheduleEntry]
    producer: Any

    if TYPE_CHECKING:

        def apply_entry(self, entry: ScheduleEntry, producer: Any = ...) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        app = kwargs.get("app", args[0] if args else None)
        # Validate at start-up (beat builds its scheduler for the banner, before
        # it runs), so bad settings and a store that cannot be built fail there.
        self.leader_config = startup.app_config(app)
        self._set_up = False
        self._sending = False  # inside _send: apply_async keeps its error
        self._send_error: BaseException | None = None
        with _collector_paused():
            super().__init__(*args, **kwargs)
            self._adapter = _BeatAdapter(self)
            self._protocol = SlotProtocol(
                self.leader_config,
                self._adapter,
                logger,
                idle=FOLLOWER_INTERVAL,
                max_sleep=self.max_interval,
                observers=(SIGNALS, metrics.OBSERVER),
            )
        if self._set_up:
            _keep_out_of_collections(len(self.schedule))

    def setup_schedule(self) -> None:
        """Deferred until this instance first leads.

        Some schedulers write shared state while setting up (django-celery-beat
        saves ``beat_schedule`` into its tables); only a leader may do that.
        """

    def set_up_as_leader(self) -> None:
        """Run the scheduler's own ``setup_schedule`` once, when this instance first leads."""
        if not self._set_up:
            super().setup_schedule()  # type: ignore[misc]
            self._set_up = True

    @property
    def lease(self) -> Any:
        """The beat election's :class:`~celery_leader.lease.Lease`, joined on first use."""
        return self._protocol.lease

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One scheduler pass; only a current leader dispatches.

        A leader wakes at least every ``POLL_INTERVAL`` to see edits of the
        entries kept in the store, however far its next slot is; so does a
        follower set up at start-up, to keep their jobs made.

        Stop signals that arrive during the pass are delivered after it (a
        second one at once): Celery's handler closes the scheduler right where
        the main thread is, and a store call it interrupts may hold the lock
        that closing the store waits for.
        """
        with _stop_signals_deferred():
            return self._tick()

    def _tick(self) -> float:
        adapter = self._adapter
        first = adapter.feed is None
        if adapter.feed is None:
            lease = self.lease
            adapter.feed = EntryFeed(self._protocol.runtime.store.entries, lease.election, logger)
        following = self.lease.term is None
        adapter.feed.quiet = following
        if (
            self._set_up
            and (first or following)
            and adapter.warm(WARM_SLICE)
            and adapter.jobs_changed()
        ):
            # A follower keeps the jobs made (code entries' a slice per tick, see
            # WARM_SLICE; store entries' at the first tick, then one version check
            # per POLL_INTERVAL and a re-read only after an edit), so a promotion
            # only loads run state. Outside the protocol's tick: seconds at 100,000
            # store entries that would otherwise run out a new leader's tick
            # timeout. Only where the schedule was set up at start-up: a scheduler
            # that writes while setting up waits until it leads.
            adapter.jobs()
        return min(self._protocol.tick(), POLL_INTERVAL)

    def leader_jobs(self, store_entries: bool = False) -> Sequence[Job]:
        """The schedule's entries as the slot protocol sees them (``leader plan`` lists them).

        Sets the schedule up as a leader does, so call it on a scheduler that never
        ticks. ``store_entries``: also the entries kept in the store (read once, on
        a connection of its own); otherwise nothing contacts the store.
        """
        adapter = self._adapter
        if not store_entries:
            return adapter.jobs()
        store = open_store(self.leader_config)
        try:
            election = self.leader_config.beat_election
            adapter.feed = EntryFeed(store.entries, election, logger, interval=0)
            return adapter.jobs()
        finally:
            adapter.feed = None
            store.close()

    def set_run_state(self, entry: ScheduleEntry, last_run_at: datetime, count: int) -> None:
        """Set ``last_run_at`` and ``total_run_count`` of ``entry`` (a hook)."""
        entry.last_run_at = last_run_at
        entry.total_run_count = count

    def entry_enabled(self, entry: ScheduleEntry) -> bool:
        """Whether ``entry`` may run now (a hook: django-celery-beat's rows can be disabled)."""
        return True

    def schedule_moved(self) -> bool:
        """Whether entries changed in a way a new ``schedule`` dict does not show (a hook:
        django-celery-beat's rows start and expire with time). Asked at every tick."""
        return False

    def edited_entries(self) -> set[str] | None:
        """Names of the entries replaced, added or removed in place in ``schedule`` since
        the jobs were last listed, or ``None``: list every entry again (a hook:
        django-celery-beat's rows reload only what changed). Asked once per listing."""
        return None

    def mark_edits(self, jobs: list[Job], edited: set[str] | None = None) -> list[Job]:
        """``jobs`` with their ``generation`` and ``active_since`` (a hook: the schedule's
        entries as edited at runtime, such as django-celery-beat's rows). Code entries
        have neither. ``edited``: ``jobs`` are only those entries (of these names) listed
        again, the others are as last marked; ``None``: ``jobs`` are all of them."""
        return jobs

    def stopped_leading(self) -> None:
        """This replica stopped dispatching (a hook): give back its broker connection."""
        self._release_broker()

    def _send(
        self, entry: ScheduleEntry, slot: str, epoch: int
    ) -> tuple[BaseException | None, bool]:
        """Publish one slot through ``apply_entry``: ``(error or None, definitely unsent)``."""
        publisher = publishing.publisher_of(self, self.leader_config.watchdog_timeout)
        try:
            producer = publisher.producer()
        except Exception as exc:  # no broker connection: nothing was sent
            return exc, True
        # Celery's apply_async reads the headers from entry.options; swap in a
        # copy for this one call so they never stick to the entry (or its model
        # row). Entries are not copied: django-celery-beat's cannot be.
        options = entry.options
        headers = {**options.get("headers", {}), "leader_epoch": epoch, "leader_slot": slot}
        if "overlap" in options:
            headers["leader_overlap"] = options["overlap"]
        kept = {k: v for k, v in options.items() if k not in ENTRY_OPTIONS}
        entry.options = {**kept, "headers": headers}
        self._send_error = None
        self._sending = True
        try:
            # apply_entry (not apply_async): code that hooks it, like
            # sentry-sdk's Crons integration, sees every slot.
            self.apply_entry(entry, producer=producer)
        except Exception as exc:
            # A hook of apply_entry raised before sending; or, after apply_async
            # kept the real failure and returned None, Celery before 5.4 failed
            # reading that None's id: the failure kept is the one that counts.
            if self._send_error is None:
                self._send_error = exc
        finally:
            self._sending = False
            entry.options = options
        error = self._send_error
        return error, error is not None and publisher.definitely_unsent(error)

    def _flush(self) -> tuple[BaseException | None, bool]:
        """Deliver the publishes :meth:`_send` buffered: ``(error or None, definitely unsent)``."""
        publisher = publishing.publisher_of(self, self.leader_config.watchdog_timeout)
        try:
            publisher.flush()
        except Exception as exc:
            return exc, publisher.definitely_unsent(exc)
        return None, False

    def apply_async(
        self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Celery's, except that a failure while sending a slot is kept for :meth:`_send`.

        Celery's ``apply_entry`` logs and swallows errors; the leader needs them
        to hand back the slot or to resign.
        """
        try:
            return super().apply_async(entry, producer, advance, **kwargs)  # type: ignore[misc]
        except Exception as exc:
            if not getattr(self, "_sending", False):
                raise
            self._send_error = exc
            return None

    def _release_broker(self) -> None:
        """An ex-leader sends nothing: give back its broker connection (reopened on promotion)."""
        publishing.publisher_of(self, self.leader_config.watchdog_timeout).release()
        producer = self.__dict__.pop("producer", None)
        connection = self.__dict__.pop("connection", None)
        held = (connection, getattr(producer, "connection", None))
        for conn in {id(c): c for c in held if c is not None}.values():
            try:
                conn.release()
            except Exception as exc:
                logger.debug("celery-leader: releasing the broker connection failed: %s", exc)

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Hand over first (demote, release, wake a follower), then close the scheduler.

        Safe to call twice: beat does on SIGTERM.
        """
        self._protocol.close()
        super().close()  # type: ignore[misc]

    @property
    def info(self) -> str:
        """Banner lines of ``celery beat``: the store (password masked) and election."""
        config = self.leader_config
        base = super().info  # type: ignore[misc]
        lines = [base] if base else []
        grace = config.missed_slots_grace
        policy = config.missed_slots + ("" if grace is None else f", grace {grace:g} s")
        lines.append(
            f"    . leader store -> {config.display_url}\n"
            f"    . leader election -> {config.beat_election} (ttl {config.ttl:g} s, "
            f"renew every {config.renew_interval:g} s, instance {config.instance_id})\n"
            f"    . leader tick timeout -> {config.watchdog_timeout:g} s, missed slots -> "
            f"{policy}, crontab clock changes -> {config.crontab_dst}"
        )
        return "\n".join(lines)


class LeaderScheduler(LeaderSchedulerMixin, Scheduler):  # type: ignore[misc]
    """Celery's in-memory scheduler, gated on the beat election.

    Schedule state lives in the lease store, so unlike ``PersistentScheduler``
    no local shelve file is written (replicas on one host would fight over
    it) and a new leader continues where the old one stopped.
    """

    def setup_schedule(self) -> None:
        """Build beat's entries at start-up, on every replica, not at the first promotion.

        Celery's in-memory scheduler writes nothing shared while setting up, and
        building its entries takes seconds for a large schedule: paid by a
        promotion, that would be hand-over time.
        """
        self.set_up_as_leader()

    def merge_inplace(self, b: dict[str, Any]) -> None:
        """Celery's, with one clock reading for every new entry's ``last_run_at`` and one
        copy of each entry's fields.

        Celery reads the clock (with zone arithmetic) per entry and copies each
        entry's fields into a new dict: seconds at 300,000 entries. The time is a
        placeholder: a leader replaces it with the stored state before the entry
        is due. As in Celery, entries not in ``b`` are removed, and an entry
        already there is updated in place.
        """
        app, schedule = self.app, self.schedule
        now = app.now()
        for key in schedule.keys() - b.keys():
            del schedule[key]
        for key, fields in b.items():
            if isinstance(fields, dict):
                entry = self.Entry(**{"last_run_at": now, **fields, "name": key, "app": app})
            else:  # anything dict() takes, as Celery does (a ScheduleEntry, say)
                entry = self.Entry(**dict(fields, name=key, app=app))
            if schedule.get(key):
                schedule[key].update(entry)
            else:
                schedule[key] = entry


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off (if it was on) while beat's schedule is built.

    The build makes millions of objects (300,000 entries) that live as long as the
    process, and the collector scanned them again and again while they were made:
    half the build's time. Garbage made meanwhile is collected once it is back on.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _keep_out_of_collections(size: int) -> None:
    """Collect what is garbage now, then leave everything alive out of later collections,
    when a schedule of ``size`` entries is large (``FREEZE_AT``) and the collector is on.

    Done once a large schedule is built: its definition lives as long as the
    process, and each full collection scanned all of it again (0.3 s at 300,000
    entries, in the leader's first ticks). Frozen objects are still freed when
    nothing refers to them; only a reference cycle among them would stay. A
    process that turned the collector off keeps its objects as they are.
    """
    if gc.isenabled() and size >= FREEZE_AT:
        gc.collect()
        gc.freeze()


class _BeatAdapter(Adapter):
    """Celery's entries and publish, as the slot protocol sees them."""

    def __init__(self, scheduler: LeaderSchedulerMixin) -> None:
        self.scheduler = scheduler
        #: Code entries' jobs, by name, with the schedule and options they were made of:
        #: listing again reuses them, and a promotion finds them made (see ``__init__``).
        self._made: dict[str, tuple[Any, Any, Job]] = {}
        self._bad_options: set[str] = set()  # entries whose leader_* options were refused
        #: The scheduler's ``schedule`` as the last :meth:`jobs` read it, and its size.
        self._entries: dict[str, ScheduleEntry] | None = None
        self._count = 0
        #: The store entries the last :meth:`jobs` read (``None``: no feed yet).
        self._records: dict[str, Entry] | None = None
        #: What the last :meth:`jobs` returned: returned again while nothing changed.
        self._listed: list[Job] | None = None
        #: The code entries' jobs of that list, as marked, by name: an entry edited in
        #: place (:meth:`LeaderSchedulerMixin.edited_entries`) replaces only its own.
        self._code: dict[str, Job] = {}
        #: The entries kept in the store; set on the first tick (which joins the lease).
        self.feed: EntryFeed | None = None
        #: Store entries' jobs, by name, with the Entry each was made of (its payload
        #: is a Celery entry): an unchanged entry keeps its job.
        self._stored: dict[str, tuple[Entry, Job]] = {}
        self._refused: set[tuple[str, str]] = set()  # (name, why) logged once
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
            series = _SeriesMemo(scheduler.leader_config.crontab_dst)
            self._warming = (entries, iter(list(entries.values())), series)
        _, left, series = self._warming
        records = {} if self.feed is None else self.feed.current()
        zone, end = scheduler.app.timezone, time.monotonic() + budget
        with _collector_paused():
            for entry in left:
                self._code_job(entry, records, zone, self._made, series)
                if time.monotonic() > end:
                    return False
        self._warming, self._warmed = None, entries
        _keep_out_of_collections(len(entries))
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
        records = None if self.feed is None else self.feed.current() or None
        return (
            current is not entries
            or len(current) != self._count
            or records is not self._records
            or scheduler.schedule_moved()
        )

    def jobs(self) -> Sequence[Job]:
        if self._listed is not None and not self.jobs_changed():
            return self._listed  # a promotion: listed at start-up, or while leading before
        scheduler = self.scheduler
        scheduler.set_up_as_leader()
        zone = scheduler.app.timezone
        # None for no store entries, feed or not: a feed that finds none changes nothing.
        records_before, entries_before = self._records, self._entries
        self._records = None if self.feed is None else self.feed.current() or None
        records = {} if self._records is None else self._records
        # Read once per pass: ``schedule`` may be a property that asks a
        # database whether the schedule changed (django-celery-beat's does, and
        # reconnects first unless CONN_MAX_AGE keeps its connection), which is
        # far too slow to pay for every entry on every tick.
        self._entries = entries = scheduler.schedule
        self._count = len(entries)
        series = _SeriesMemo(scheduler.leader_config.crontab_dst)
        edited = scheduler.edited_entries()
        if (
            edited is None
            or self._listed is None
            or entries is not entries_before
            or self._records is not records_before
        ):
            first = self._listed is None
            made, self._made = self._made, {}
            with _collector_paused():
                jobs = [
                    job
                    for entry in entries.values()
                    if (job := self._code_job(entry, records, zone, made, series)) is not None
                ]
            self._code = {job.name: job for job in scheduler.mark_edits(jobs)}
            if first and self._warmed is not entries:  # made here, not by warm()
                _keep_out_of_collections(len(entries))
            self._warming, self._warmed = None, entries
        else:
            # Only these entries changed: the others keep their jobs, so that a large
            # schedule costs an edit what the edit touched (the protocol skips a job
            # that is the one it holds).
            jobs = []
            for name in edited:
                self._code.pop(name, None)
                entry = entries.get(name)
                job = (
                    None
                    if entry is None
                    else self._code_job(entry, records, zone, self._made, series)
                )
                if job is None:
                    self._made.pop(name, None)
                else:
                    jobs.append(job)
            self._code.update((job.name, job) for job in scheduler.mark_edits(jobs, edited))
        self._listed = list(self._code.values()) + self._store_jobs(records, set(self._made))
        return self._listed

    def _code_job(
        self,
        entry: ScheduleEntry,
        records: dict[str, Entry],
        zone: Any,
        made: dict[str, tuple[Any, Any, Job]],
        series: _SeriesMemo,
    ) -> Job | None:
        """The job of beat's ``entry``, or None while it may not run; reused from ``made``
        when its schedule and options are the ones it was made of, else made with the
        pass's shared ``series``. Kept in ``_made``."""
        scheduler = self.scheduler
        if not scheduler.entry_enabled(entry):
            return None
        kept = records.get(entry.name)
        since = None
        if kept is not None and kept.kind == CODE:
            if not kept.enabled:
                return None  # paused from the CLI or the API
            since = kept.active_since  # resumed: nothing for the paused time
        sched, options = entry.schedule, entry.options
        known = made.get(entry.name)
        if known is not None and known[0] is sched and known[1] is options:
            job = known[2]  # Celery's successor of a sent entry shares both
            if job.active_since != since or job.zone != zone:
                job = replace(job, zone=zone, active_since=since)
        else:
            policy, grace = self._policy(entry)
            job = Job(
                entry.name,
                series.of(sched),
                policy,
                grace,
                zone,
                entry.name,
                active_since=since,
            )
        self._made[entry.name] = (sched, options, job)
        return job

    def _store_jobs(self, records: dict[str, Entry], code: set[str]) -> list[Job]:
        """The enabled store entries this leader may send, as jobs (refusals logged once)."""
        config = self.scheduler.leader_config
        jobs = []
        stored = {}
        # One clock reading for every new entry's placeholder last_run_at (as
        # merge_inplace does): a leader loads the stored one before sending.
        now = self.scheduler.app.now()
        for name, entry in records.items():
            known = self._stored.get(name)
            # The feed keeps an unedited entry's object: checked when first listed,
            # so a list after one edit of a large schedule costs a lookup per entry.
            if known is not None and known[0] is entry and name not in code:
                stored[name] = known
                jobs.append(known[1])
                continue
            if entry.kind != STORE or not entry.enabled:
                continue
            if name in code:
                self._refuse(name, "a code entry has its name; the code entry runs")
                continue
            if not allowed(entry.task, config.entries_allow):
                self._refuse(name, f"its task {entry.task} is outside leader_entries_allow")
                continue
            if known is not None and known[0] == entry:
                job = known[1]  # unchanged: the same job, so the protocol skips it
            else:
                job = Job(
                    name,
                    entry.series(),
                    entry.missed_slots or config.missed_slots,
                    entry.missed_slots_grace
                    if entry.missed_slots_grace is not None
                    else config.missed_slots_grace,
                    self.scheduler.app.timezone,
                    self._celery_entry(entry, now),
                    generation=entry.generation,
                    active_since=entry.active_since,
                )
            stored[name] = (entry, job)
            jobs.append(job)
        self._stored = stored
        return jobs

    def _refuse(self, name: str, why: str) -> None:
        if (name, why) not in self._refused:
            self._refused.add((name, why))
            logger.error("celery-leader: not sending stored entry %s: %s", name, why)

    def _celery_entry(self, entry: Entry, last_run_at: datetime) -> ScheduleEntry:
        """A Celery entry that sends what ``entry`` names (never put in beat's schedule)."""
        return ScheduleEntry(
            name=entry.name,
            last_run_at=last_run_at,
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
                logger.error("celery-leader: %s; using the settings instead", exc)
            return config.missed_slots, config.missed_slots_grace
        return policy, grace

    def _entry(self, job: Job) -> ScheduleEntry:
        if isinstance(job.payload, ScheduleEntry):
            return job.payload  # a store entry's
        # Looked up by name: reserve() replaces a sent entry with its successor
        # (in the same dict, which ``schedule`` returns every time it is unchanged).
        entries = self._entries if self._entries is not None else self.scheduler.schedule
        return entries[job.payload]

    def due_now(self, job: Job, now: datetime) -> tuple[datetime | None, float]:
        scheduler: Any = self.scheduler
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
        scheduler: Any = self.scheduler
        entry = self._entry(job)
        if sent and not isinstance(job.payload, ScheduleEntry):
            # Celery's own bookkeeping of a run (django-celery-beat saves its row).
            entry = scheduler.reserve(entry)
        local = last_run_at.astimezone(scheduler.app.timezone)
        if isinstance(job.payload, ScheduleEntry):
            # A store entry's: the scheduler's hook may expect its own kind of entry.
            entry.last_run_at, entry.total_run_count = local, count
            return
        self.scheduler.set_run_state(entry, local, count)

    def send(self, job: Job, slot: str, due: datetime, epoch: int) -> Outcome:
        error, definite = self.scheduler._send(self._entry(job), slot, epoch)
        return Outcome(error, definite)

    def flush(self) -> Outcome:
        error, definite = self.scheduler._flush()
        return Outcome(error, definite)

    def demoted(self) -> None:
        self.scheduler.stopped_leading()

    def publishing(self) -> AbstractContextManager[object]:
        return _publishing(self.scheduler)


class _SeriesMemo:
    """The series of one listing pass, made once per distinct schedule.

    Most entries of a large schedule share a few schedules: one object (a crontab
    made once for many entries) or equal ones (Celery makes a ``schedule`` per
    entry given seconds). A crontab's series costs microseconds and a kilobyte.
    """

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
    """All that :func:`series_of` reads of ``sched``, by value (``None``: not shared).

    Celery makes a new ``schedule`` for every entry given a number of seconds,
    and a schedule written as a crontab per entry is as common as one shared.
    """
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
    """The due instants of a Celery schedule, or ``None`` when only its ``is_due`` can tell.

    Interval subclasses that override ``is_due`` keep their own rule.
    """
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


#: Signals whose Celery handlers stop beat by raising ``SystemExit`` wherever the
#: main thread is, after closing the scheduler there. Raised between a slot's
#: claim and its publish, that would lose the claimed slot; raised inside a store
#: call, closing the store would wait for a lock that call holds. So they are
#: held back until the tick ends: its store calls and publishes each give up
#: within their deadlines, which bounds how long a stop waits, and the same
#: signal again is delivered at once. SIGKILL is never held back.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


@contextmanager
def _publishing(scheduler: LeaderSchedulerMixin) -> Iterator[None]:
    """One claimed batch: publishes pipelined where they can be (stop signals are held
    back for the whole tick, see :meth:`LeaderSchedulerMixin.tick`)."""
    publisher = publishing.publisher_of(scheduler, scheduler.leader_config.watchdog_timeout)
    with publisher.pipelined():
        yield


@contextmanager
def _stop_signals_deferred() -> Iterator[None]:
    """Record the stop signals that arrive in this block and deliver them after it.

    Python runs signal handlers in the main thread only, so only the main
    thread swaps them (a mask would not do: the kernel hands a process signal
    to any thread that does not block it).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def restore() -> None:
        for sig, handler in previous.items():
            # None: a handler installed outside Python, which cannot be put back.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def hold(signum: int, _frame: object) -> None:
        if signum not in arrived:
            arrived.append(signum)
            return
        # Sent again while held: whoever sends it will not wait; stop now.
        restore()
        arrived.clear()
        signal.raise_signal(signum)

    previous = {sig: signal.signal(sig, hold) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        restore()
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)
