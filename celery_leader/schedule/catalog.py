"""The entries kept in the store, as jobs: one catalog for Celery beat and Dramatiq."""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Mapping, Sequence
from datetime import datetime, timezone, tzinfo

from ..backends import EntryStore, open_store
from ..settings.config import LeaderConfig
from .entries import CODE, STORE, Entry, allowed, instant_now
from .feed import EntryFeed
from .jobs import Adapter, Job

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


def next_wake(records: Mapping[str, Entry], now: datetime) -> datetime | None:
    """The first end of a pause after ``now`` among ``records`` (``None``: none):
    when an entry runs again by itself, with no edit in the store to say so."""
    ends = [
        e.paused_until
        for e in records.values()
        if not e.enabled and e.paused_until is not None and e.paused_until > now
    ]
    return min(ends, default=None)


class EntryCatalog:
    """The entries one scheduler's election keeps in the store, and their jobs; ``refusal``
    is the framework's own reason not to send an entry, asked after the common ones."""

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
        self.listed: dict[str, Entry] | None = None  # the records the last listing read
        self._source: dict[str, Entry] | None = None  # the feed's records it was read from
        #: When the first pause of those records runs out: the entries are listed again
        #: then, though the store did not change.
        self._wake: datetime | None = None
        self._planning = False  # see now()
        #: Store entries' jobs, by name, with the Entry each was made of: an unchanged
        #: entry keeps its job (so the protocol skips it).
        self._stored: dict[str, tuple[Entry, Job]] = {}
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

    def changed(self) -> bool:
        """Whether the records moved since the last listing read them, or a pause
        among them ran out."""
        return self.current() is not self._source or self._woke()

    def read(self) -> dict[str, Entry]:
        """The records a listing works from (kept as :attr:`listed`): a new object
        whenever they changed or a pause ran out, as adapters compare by identity."""
        source = self.current()
        if source is not self._source or self._woke():
            ran_out = source is self._source
            self._source = source
            self._wake = None if source is None else next_wake(source, self.now())
            self.listed = dict(source) if ran_out and source is not None else source
        return {} if self.listed is None else self.listed

    def _woke(self) -> bool:
        return self._wake is not None and self.now() >= self._wake

    def jobs(
        self,
        records: Mapping[str, Entry],
        code: Container[str],
        payload: Callable[[Entry], object],
        zone: tzinfo = timezone.utc,
    ) -> list[Job]:
        """The enabled store entries of ``records`` this scheduler may send, as jobs
        (each refusal logged once). ``code``: the names of the code entries, which win;
        ``payload``: what a new or edited entry's job carries to the framework's publish."""
        config = self.config
        now = self.now()
        jobs = []
        stored = {}
        for name, entry in records.items():
            known = self._stored.get(name)
            # The feed keeps an unedited entry's object: checked when first listed,
            # so a list after one edit of a large schedule costs a lookup per entry.
            if known is not None and known[0] is entry and name not in code:
                stored[name] = known
                jobs.append(known[1])
                continue
            if entry.kind != STORE or entry.paused_at(now):
                continue
            why = self._refused_why(name, entry, code)
            if why is not None:
                if (name, why) not in self._refused:
                    self._refused.add((name, why))
                    self.logger.error("celery-leader: not sending stored entry %s: %s", name, why)
                continue
            if known is None or known[0] != entry:
                missed, grace = policy(config, entry.missed_slots, entry.missed_slots_grace)
                since = entry.running_since(now)
                parts = (missed, grace, zone, payload(entry), entry.generation, since)
                job = Job(name, entry.series(), *parts)
                known = (entry, job)
            stored[name] = known
            jobs.append(known[1])
        self._stored = stored
        return jobs

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
        self,
        name: str,
        code: Container[str],
        payload: Callable[[Entry], object],
        zone: tzinfo = timezone.utc,
    ) -> Job | str:
        """The job of one run of store entry ``name`` now (paused or not), or why not:
        what :meth:`jobs` would refuse it for. ``code`` and ``payload`` as there."""
        entry = (self.current() or {}).get(name)
        if entry is None or entry.kind != STORE:
            return f"no entry {name} in the code or the store"
        why = self._refused_why(name, entry, code)
        if why is not None:
            return f"store entry {name}: {why}"
        missed, grace = policy(self.config, entry.missed_slots, entry.missed_slots_grace)
        return Job(name, None, missed, grace, zone, payload(entry), generation=entry.generation)

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
            adapter.jobs()

    def read_once(self, jobs: Callable[[], Sequence[Job]]) -> Sequence[Job]:
        """``jobs()`` with the store's entries read once, on a connection of its own
        (``leader plan --stored``)."""
        store = open_store(self.config)
        try:
            self.open(store.entries, self.config.beat_election, interval=0)
            self._planning = True
            return jobs()
        finally:
            self._planning = False
            self.feed = None
            store.close()
