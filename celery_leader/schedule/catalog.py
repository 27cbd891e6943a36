"""The entries kept in the store, as jobs: one catalog for Celery beat and Dramatiq."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Container, Mapping, Sequence
from datetime import datetime, timezone, tzinfo

from ..backends import EntryStore, open_store
from ..settings.config import LeaderConfig
from .entries import CODE, STORE, Entry, allowed, instant_now
from .feed import EntryFeed
from .jobs import Adapter, Job
from .series import Series

#: Series kept for sharing (:meth:`EntryCatalog._series_of`): more distinct schedules
#: than this start the memo again.
_SERIES_KEPT = 4096

#: What :meth:`EntryCatalog.now` answers while planning.
_END_OF_TIME = datetime.max.replace(tzinfo=timezone.utc)


def policy(
    config: LeaderConfig, missed_slots: str | None, grace: float | None
) -> tuple[str, float | None]:
    """An entry's missed-slot policy and grace: its own where it has them, else the settings."""
    default = config.missed_slots_grace
    return missed_slots or config.missed_slots, default if grace is None else grace


def kept_pause(
    records: Mapping[str, Entry], name: str, now: datetime
) -> tuple[bool, datetime | None]:
    """Whether code entry ``name`` may run at ``now`` (not paused from the CLI or the
    API, or its pause ran out), and since when: resumed, nothing is sent for the
    paused time (``None``: always)."""
    kept = records.get(name)
    if kept is None or kept.kind != CODE:
        return True, None
    return not kept.paused_at(now), kept.running_since(now)


class EntryCatalog:
    """The entries one scheduler's election keeps in the store, and their jobs; ``refusal``
    is the framework's own reason not to send an entry, asked after the common ones.

    A store entry's job carries its :class:`~.entries.Entry` as payload; the framework
    makes what it sends of it only when it sends. After the first listing,
    :meth:`job_edits` makes the jobs of the entries that changed, and only those."""

    def __init__(
        self,
        config: LeaderConfig,
        logger: logging.Logger,
        noun: str,
        refusal: Callable[[Entry], str | None] | None = None,
    ) -> None:
        self.config = config
        self.logger = logger
        self.noun = noun
        self.refusal = refusal
        self.feed: EntryFeed | None = None  # opened on the first tick (see follow)
        #: When pauses of the records run out, as a heap of (end, name): such an entry
        #: is made a job again then, though the store did not change.
        self._wakes: list[tuple[datetime, str]] = []
        self._planning = False  # see now()
        #: Store entries' jobs, by name: an unchanged entry keeps its job (so the
        #: protocol skips it).
        self._stored: dict[str, Job] = {}
        #: Series by schedule: most entries of a large schedule share a few.
        self._series: dict[tuple[object, ...], Series] = {}
        self._refused: set[tuple[str, str]] = set()  # (name, why) logged once

    def open(self, store: EntryStore, election: str, interval: float | None = None) -> EntryFeed:
        """Read ``election``'s entries from ``store`` from now on."""
        self.feed = EntryFeed(store, election, self.logger, interval)
        return self.feed

    def current(self) -> dict[str, Entry] | None:
        """The records now; ``None`` for none (a feed that finds none changes nothing)."""
        return None if self.feed is None else self.feed.current() or None

    def now(self) -> datetime:
        """The instant pauses are judged at: this host's wall clock (a pause's end
        is also its entry's ``active_since``, so no slot due before it is sent).
        While planning (:meth:`read_once`), the end of time: a pause with an end
        counts as over, and its entry is planned from that end."""
        return _END_OF_TIME if self._planning else instant_now()

    def loading(self) -> bool:
        """Whether a whole read of the records is under way: a leader ticks again at once
        (a follower keeps its pace, leaving the CPU to the leader)."""
        return self.feed is not None and self.feed.loading

    def changed(self) -> bool:
        """Whether records changed since the last listing took them, or a pause among
        them ran out."""
        self.current()
        return (self.feed is not None and self.feed.pending()) or self._woke()

    def read(self) -> dict[str, Entry]:
        """The records a whole listing works from."""
        return self.current() or {}

    def last_read(self) -> dict[str, Entry]:
        """The records as last read, the store not asked."""
        return {} if self.feed is None else self.feed.last_read()

    def _woke(self) -> bool:
        return bool(self._wakes) and self.now() >= self._wakes[0][0]

    def jobs(
        self, records: Mapping[str, Entry], code: Container[str], zone: tzinfo = timezone.utc
    ) -> list[Job]:
        """The enabled store entries of ``records`` this scheduler may send, as jobs
        (each refusal logged once). ``code``: the names of the code entries, which win."""
        if self.feed is not None:
            self.feed.take_changes()  # all of them are listed now
        now = self.now()
        self._wakes = []
        stored = {}
        for name, entry in records.items():
            job = self._job(name, entry, code, now, self._stored.get(name), zone)
            if job is not None:
                stored[name] = job
        self._stored = stored
        return list(stored.values())

    def job_edits(
        self, code: Container[str], zone: tzinfo = timezone.utc
    ) -> tuple[set[str], dict[str, Job | None]]:
        """The names of the records that changed since the last listing (or whose pause
        ran out), and the jobs of store entries made or gone since (``None``: no job now).
        Costs what changed, not the size of the schedule."""
        names = set() if self.feed is None else self.feed.take_changes()
        now = self.now()
        while self._wakes and now >= self._wakes[0][0]:
            names.add(heapq.heappop(self._wakes)[1])
        records = self.last_read()  # read by changed(), just before
        edits: dict[str, Job | None] = {}
        for name in names:
            before = self._stored.pop(name, None)
            entry = records.get(name)
            job = None if entry is None else self._job(name, entry, code, now, before, zone)
            if job is not None:
                self._stored[name] = job
            if job is not before:
                edits[name] = job
        return names, edits

    def stored_jobs(self) -> list[Job]:
        """The store entries' jobs as last listed or edited."""
        return list(self._stored.values())

    def _job(
        self,
        name: str,
        entry: Entry,
        code: Container[str],
        now: datetime,
        known: Job | None,
        zone: tzinfo = timezone.utc,
    ) -> Job | None:
        """The job of record ``entry``, or ``None`` (a code entry's pause, paused, refused);
        ``known`` reused when made of the same entry."""
        if not entry.enabled and entry.paused_until is not None and entry.paused_until > now:
            heapq.heappush(self._wakes, (entry.paused_until, name))
        if entry.kind != STORE or entry.paused_at(now):
            return None
        # The feed keeps an unedited entry's object: checked when first made.
        if known is not None and known.payload is entry and name not in code:
            return known
        why = self._refused_why(name, entry, code)
        if why is not None:
            if (name, why) not in self._refused:
                self._refused.add((name, why))
                self.logger.error("celery-leader: not sending stored entry %s: %s", name, why)
            return None
        missed, grace = policy(self.config, entry.missed_slots, entry.missed_slots_grace)
        since = entry.running_since(now)
        series = self._series_of(entry)
        return Job(name, series, missed, grace, zone, entry, entry.generation, since)

    def _series_of(self, entry: Entry) -> Series:
        """``entry.series()``, shared with the entries of the same schedule."""
        if entry.at is not None:
            return entry.series()  # one instant: rarely shared
        key = (entry.every, entry.cron, entry.tz, entry.start_at, entry.end_at)
        series = self._series.get(key)
        if series is None:
            if len(self._series) >= _SERIES_KEPT:
                self._series.clear()
            series = self._series[key] = entry.series()
        return series

    def _refused_why(self, name: str, entry: Entry, code: Container[str]) -> str | None:
        """Why store entry ``entry`` is not sent (``None``: it may be)."""
        # Written by another framework's app or an older tool: refused, never half-sent.
        if name in code:
            return "a code entry has its name; the code entry runs"
        if not allowed(entry.task, self.config.entries_allow):
            return f"its {self.noun} {entry.task} is outside leader_entries_allow"
        return None if self.refusal is None else self.refusal(entry)

    def requests(self) -> Mapping[str, str]:
        """The run-now requests, as last read with the records (none before the first read)."""
        return {} if self.feed is None else self.feed.requests()

    def run_job(
        self, name: str, code: Container[str], zone: tzinfo = timezone.utc
    ) -> Job | str:
        """The job of one run of store entry ``name`` now (paused or not), or why not:
        what :meth:`jobs` would refuse it for. ``code`` as there."""
        entry = (self.current() or {}).get(name)
        if entry is None or entry.kind != STORE:
            return f"no entry {name} in the code or the store"
        why = self._refused_why(name, entry, code)
        if why is not None:
            return f"store entry {name}: {why}"
        missed, grace = policy(self.config, entry.missed_slots, entry.missed_slots_grace)
        return Job(name, None, missed, grace, zone, entry, generation=entry.generation)

    def follow(
        self,
        store: EntryStore,
        following: bool,
        adapter: Adapter,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        """Before each tick: read ``store``, and while ``following`` keep the jobs made, so a
        promotion only loads run state (seconds at 100,000 entries, outside any tick timeout).
        ``ready``: whether the adapter may list its jobs now."""
        first = self.feed is None
        feed = self.feed or self.open(store, self.config.beat_election)
        # A follower's lease already reports a store it cannot reach.
        feed.quiet = following
        if (first or following) and (ready is None or ready()) and adapter.jobs_changed():
            if first or adapter.job_edits() is None:
                adapter.jobs()

    def read_once(self, jobs: Callable[[], Sequence[Job]]) -> Sequence[Job]:
        """``jobs()`` with the store's entries read once, on a connection of its own
        (``leader plan --stored``)."""
        store = open_store(self.config)
        try:
            feed = self.open(store.entries, self.config.beat_election, interval=0)
            feed.current()
            while feed.loading:  # every page: a plan lists every entry
                feed.current()
            self._planning = True
            return jobs()
        finally:
            self._planning = False
            self.feed = None
            store.close()
