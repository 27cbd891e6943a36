"""The schedule state a leader holds (:class:`HeldJobs`), loaded for a term (:class:`StateSync`).

A new term loads it in chunks, most frequent entries first, a slice of time per
tick, so a schedule too large to load within ``leader_tick_timeout`` is not a hung
tick. Stored state never moves backwards, except: an entry with no state is
anchored at its series' anchor before now, with a claim, before anything is sent;
state ahead of this clock is waited for (one WARNING: moving it back would resend
what a fast replica sent), unless ahead by more than :data:`REPAIR_AFTER` (no
clock skew explains it): then re-anchored at now; unreadable state (one ERROR) and
state of another generation (a re-created entry starts fresh, backfilling nothing)
are replaced by an anchor. State without a generation (older) is adopted.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..backends import Fence, FencedRecords
from ..election.lease import Lease
from ..exceptions import StoreUnavailable, TermEnded
from .due import DueIndex
from .jobs import Adapter, Job
from .policy import counted_after, later
from .runtime import SchedulerRuntime
from .state import Claim, dump_state, parse_state

#: Clock skew that goes unmentioned: replicas' clocks disagree by milliseconds.
MAX_CLOCK_SKEW = timedelta(seconds=1)

#: Stored state further ahead than this is repaired rather than waited for: longer than
#: any clock change or NTP skew, shorter than a day (the typical wrong-date mistake).
REPAIR_AFTER = timedelta(hours=6)


@dataclass(frozen=True, slots=True)
class Written:
    """Who wrote a stored state and the slot it names: with the :class:`EntryState`'s own
    fields, all :func:`dump_state` needs to write that text again, byte for byte. Kept
    instead of the text (about 200 bytes an entry); shared by the states of one writer
    that name no slot."""

    epoch: int
    by: str
    slot: str | None = None


@functools.lru_cache(maxsize=64)
def _unslotted(epoch: int, by: str) -> Written:
    return Written(epoch, by)


def written(epoch: int, by: str, slot: str | None) -> Written:
    """A :class:`Written`, the one shared by its writer's states where it names no slot."""
    return _unslotted(epoch, by) if slot is None else Written(epoch, by, slot)


@dataclass(frozen=True, slots=True)
class EntryState:
    """What the store records for one entry, as this leader last saw or wrote it; one per
    entry, so kept small (its next due time lives in the protocol's ``DueIndex``)."""

    #: The stored value, or how to write it again (:class:`Written`); ``None``: none.
    stored: str | Written | None
    last_run_at: datetime  # UTC: the due time of the last slot recorded
    count: int
    generation: str | None = None  # the job's generation this state belongs to
    active_since: datetime | None = None  # the job's latest active_since, as stored

    @classmethod
    def write(
        cls,
        last_run_at: datetime,
        count: int,
        writer: tuple[int, str],
        slot: str | None,
        generation: str | None,
        active_since: datetime | None,
    ) -> EntryState:
        """The state that ``writer`` (epoch, instance id) writes (see :attr:`raw`)."""
        return cls(written(*writer, slot), last_run_at, count, generation, active_since)

    @property
    def raw(self) -> str | None:
        """The stored value: the ``expected`` of the next claim."""
        stored = self.stored
        if not isinstance(stored, Written):
            return stored
        return dump_state(
            self.last_run_at,
            self.count,
            stored.epoch,
            stored.by,
            stored.slot,
            self.generation,
            self.active_since,
        )

    @property
    def slot(self) -> str | None:
        """The slot the stored state names as its last one, if any."""
        stored = self.stored
        if isinstance(stored, Written):
            return stored.slot
        state = None if stored is None else parse_state(stored)
        return None if state is None else state.slot


class StateSync:
    """Loads and anchors the schedule state of one election for its current term."""

    def __init__(self, lease: Lease, records: FencedRecords, logger: logging.Logger) -> None:
        self.lease = lease
        self.records = records
        self.logger = logger

    def read(self, names: Sequence[str]) -> dict[str, str] | None:
        """The stored state of ``names``, in one round trip (``None`` when the store reads
        only all of it: :meth:`read_all`)."""
        lease = self.lease
        with lease.observe("load_state"):
            return self.records.load_some(lease.election, names)

    def read_all(self, progress: Callable[[], None]) -> dict[str, str]:
        """The election's whole stored state; ``progress`` is called as parts of it are read."""
        lease = self.lease
        with lease.observe("load_state"):
            return self.records.load_in_parts(lease.election, progress)

    def load(
        self, jobs: Sequence[Job], fence: Fence, now: datetime, stored: dict[str, str]
    ) -> dict[str, EntryState]:
        """The state of ``jobs``: adopted from ``stored`` (what :meth:`read` returned, for
        them at least), or anchored with one claim."""
        states: dict[str, EntryState] = {}
        anchors: list[Job] = []
        for job in jobs:
            adopted = self._adopt(job, stored.get(job.name), now)
            if adopted is None:
                anchors.append(job)
            else:
                states[job.name] = adopted
        self.anchor(anchors, fence, now, states, stored)
        return states

    def anchor(
        self,
        jobs: Sequence[Job],
        fence: Fence,
        now: datetime,
        states: dict[str, EntryState],
        stored: dict[str, str],
    ) -> None:
        """Anchor ``jobs`` at now in one claim round trip and add them to ``states``."""
        if not jobs:
            return
        lease = self.lease
        by = (fence.term.epoch, lease.instance_id)
        fresh = []
        for job in jobs:
            start = job.series.anchor(now) if job.series is not None else now
            new = dump_state(start, 0, *by, None, job.generation, job.active_since)
            fresh.append((job, Claim(job.name, stored.get(job.name), new), start))
        with lease.observe("claim"):
            won = self.records.claim(fence, [c.write() for _, c, _ in fresh])
        if not any(won):
            # Every claim fails at once only when the term is no longer current.
            raise TermEnded(
                f"the term (epoch {fence.term.epoch}) ended while loading the schedule state"
            )
        if not all(won):
            raise TermEnded("another leader wrote the schedule state while this one loaded it")
        for job, _, start in fresh:
            since = job.active_since
            states[job.name] = EntryState.write(start, 0, by, None, job.generation, since)

    def restamp(self, jobs: Sequence[Job], fence: Fence, states: dict[str, EntryState]) -> bool:
        """Record each job's newer ``active_since`` in the store, in one claim round trip, at
        once: a successor promoted before its next slot must not count the pause as missed.
        False when the stored state moved meanwhile (reload it)."""
        lease = self.lease
        by = (fence.term.epoch, lease.instance_id)
        fresh = []
        for job in jobs:
            state, since = states[job.name], job.active_since
            new = dump_state(state.last_run_at, state.count, *by, None, state.generation, since)
            last, count, generation = state.last_run_at, state.count, state.generation
            after = EntryState.write(last, count, by, None, generation, since)
            fresh.append((job, Claim(job.name, state.raw, new), after))
        with lease.observe("claim"):
            won = self.records.claim(fence, [c.write() for _, c, _ in fresh])
        for (job, _, after), ok in zip(fresh, won, strict=True):
            if ok:
                states[job.name] = after
        return all(won)

    def _adopt(self, job: Job, raw: str | None, now: datetime) -> EntryState | None:
        """The stored state of ``job``, or ``None`` when it must be anchored."""
        if raw is None:
            return None
        state = parse_state(raw)
        if state is None:
            msg = (
                "celery-leader: unreadable schedule state of %r: %.100r (replaced by an anchor "
                "at now)"
            )
            self.logger.error(msg, job.name, raw)
            return None
        if state.generation is not None and state.generation != job.generation:
            msg = (
                "celery-leader: entry %r was re-created (generation %s, stored state of %s): "
                "it starts anew from now"
            )
            self.logger.info(msg, job.name, job.generation, state.generation)
            return None
        ahead = state.last_run_at - now
        if ahead > REPAIR_AFTER:
            msg = (
                "celery-leader: entry %r has a stored last_run_at in the future (%s, now %s, "
                "%s ahead; more than clock skew explains): starting it anew from now"
            )
            last = state.last_run_at.isoformat()
            self.logger.warning(msg, job.name, last, now.isoformat(), _span(ahead))
            return None
        if ahead > MAX_CLOCK_SKEW:
            msg = (
                "celery-leader: entry %r last sent a slot due %s, %s ahead of this replica's "
                "clock (now %s): it waits until this clock passes that (a replica's clock "
                "runs ahead, or this one's behind)"
            )
            last = state.last_run_at.isoformat()
            self.logger.warning(msg, job.name, last, _span(ahead), now.isoformat())
        # The job's generation, also for a state written before generations: it is
        # the same entry, and the next claim records the generation.
        parts = (state.last_run_at, state.total_run_count, job.generation, state.active_since)
        stored: str | Written = raw
        if state.epoch is not None and state.by is not None and state.generation == job.generation:
            # Kept as its parts where they write it again exactly (this version wrote it).
            again = written(state.epoch, sys.intern(state.by), state.slot)
            if EntryState(again, *parts).raw == raw:
                stored = again
        return EntryState(stored, *parts)


def _span(delta: timedelta) -> str:
    """``delta`` for a log line: ``"12.5 s"``, ``"3.2 h"``."""
    seconds = delta.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


#: Entries whose state one claim round trip loads or anchors on a new term.
LOAD_CHUNK = 2000
#: Seconds of loading per tick while a new term loads its state: between slices
#: the leader dispatches what is loaded and due (a 1 s entry stays on time).
LOAD_SLICE = 0.2


def _spacing(job: Job) -> float:
    return 0.0 if job.series is None else job.series.spacing()


def _load_order(jobs: Iterable[Job]) -> list[Job]:
    """``jobs`` in the order a new term loads them, from the end: most frequent first,
    and first of all those without a series (they may be due at any tick)."""
    return sorted(jobs, key=_spacing, reverse=True)


def _resumed(job: Job, state: EntryState) -> bool:
    """Whether ``job`` was resumed or re-timed after its stored ``active_since``."""
    return job.active_since is not None and (
        state.active_since is None or job.active_since > state.active_since
    )


class HeldJobs:
    """The jobs as last listed, their loaded state, and when each is next due. Methods that
    touch the store return False when the state must be loaded again before dispatching."""

    def __init__(self, runtime: SchedulerRuntime, adapter: Adapter, logger: logging.Logger) -> None:
        self.runtime = runtime
        self.adapter = adapter
        self.logger = logger
        self.jobs: dict[str, Job] = {}  # the jobs as last listed, by name
        self.states: dict[str, EntryState] = {}  # loaded state, by name
        self.due = DueIndex()  # next due times of loaded jobs with a series
        self.polled: dict[str, None] = {}  # loaded jobs without a series, in order
        self.pending: list[Job] = []  # jobs whose state is not loaded yet; the next last
        #: Jobs whose stuck schedule was logged this term (see ``Dispatcher``).
        self.stuck: set[str] = set()
        #: The store's whole state, read for ``pending`` by stores that cannot read some keys.
        self._stored: dict[str, str] | None = None
        self._dropped: set[str] = set()  # names whose state was dropped since it was read
        self._load_error: str | None = None

    def clear(self) -> None:
        """Drop every entry's state: a follower holds none."""
        if self.jobs or self.states or self.pending:
            self.jobs, self.states, self.pending = {}, {}, []
            self.polled, self._stored = {}, None
            self.due.clear()

    def begin(self, jobs: Sequence[Job]) -> None:
        """Hold ``jobs``, none of their state loaded yet (a new term, or a reload)."""
        self.clear()
        self.jobs = {job.name: job for job in jobs}
        self.pending = _load_order(jobs)

    def apply(self, jobs: Sequence[Job], fence: Fence) -> bool:
        """Take in the jobs as listed now: forget the gone, load the new or re-created, re-time
        the edited at once. Gone jobs' stored state stays: one that comes back loads it again,
        and its ``generation`` and ``active_since`` say what of it still counts."""
        old, self.jobs = self.jobs, {job.name: job for job in jobs}
        for name in old.keys() - self.jobs.keys():
            self._drop(name)
        fresh = False
        stale = []
        for job in jobs:
            before = old.get(job.name)
            if before is job or before == job:
                continue
            state = self.states.get(job.name)
            if state is not None and state.generation != job.generation:
                self._drop(job.name)  # re-created: its state is loaded (anchored) anew
                state = None
            if state is None:
                fresh = True
                continue
            if _resumed(job, state):
                stale.append(job)
            self.settle(job, state)
        if fresh or self.pending:
            self.pending = _load_order([j for j in jobs if j.name not in self.states])
        if fresh:
            self._stored = None  # read again: another leader may have written it since
        return self._restamp(stale, fence)

    def apply_edits(self, edits: Mapping[str, Job | None], fence: Fence) -> bool:
        """Take in the jobs that changed (name -> job, ``None``: gone), as :meth:`apply`
        does for a whole list, touching nothing else: an edit of one entry of a million
        costs one entry's work."""
        fresh: list[Job] = []
        stale = []
        for name, job in edits.items():
            before = self.jobs.pop(name, None)
            if job is None:
                self._drop(name)
                continue
            if before is not None and (before is job or before == job):
                self.jobs[name] = before  # the object pending, if it is
                continue
            self.jobs[name] = job
            state = self.states.get(name)
            if state is not None and state.generation != job.generation:
                self._drop(name)
                state = None
            if state is None:
                fresh.append(job)
                continue
            if _resumed(job, state):
                stale.append(job)
            self.settle(job, state)
        if fresh:
            self._queue(fresh)
            # New names' state is as the store's whole state was read this term (only
            # this leader writes now, and only what it loaded); a name loaded and dropped
            # since is read again, as this leader may have written it meanwhile.
            if any(job.name in self._dropped for job in fresh):
                self._stored = None
        return self._restamp(stale, fence)

    def _queue(self, jobs: list[Job]) -> None:
        """Add ``jobs`` to those pending, keeping the most frequent near the end (loaded
        first) without sorting them all again: each page of a large schedule adds some."""
        ordered = _load_order(jobs)
        pending = self.pending
        if pending and ordered and _spacing(ordered[0]) > _spacing(pending[-1]):
            # Split: the less frequent wait behind all pending, the rest go first.
            cut = next(
                (i for i, j in enumerate(ordered) if _spacing(j) <= _spacing(pending[-1])),
                len(ordered),
            )
            pending[:0] = ordered[:cut]
            ordered = ordered[cut:]
        pending.extend(ordered)

    def _drop(self, name: str) -> None:
        if self.states.pop(name, None) is not None and self._stored is not None:
            self._dropped.add(name)
        self.due.discard(name)
        self.polled.pop(name, None)
        self.stuck.discard(name)

    def settle(self, job: Job, state: EntryState) -> None:
        """Put ``job`` (its state loaded, claimed or edited) where the next tick finds it."""
        if job.series is None:
            self.polled[job.name] = None
            return
        self.polled.pop(job.name, None)
        since = later(job.active_since, state.active_since)
        # A changed schedule takes effect at once: never wait out the old one.
        self.due.set(job.name, job.series.next_after(counted_after(state.last_run_at, since)))

    def _restamp(self, jobs: Sequence[Job], fence: Fence) -> bool:
        """Store the ``active_since`` of jobs resumed or re-timed since their state was written."""
        if not jobs:
            return True
        try:
            if StateSync(self.runtime.lease, self.runtime.store.records, self.logger).restamp(
                jobs, fence, self.states
            ):
                for job in jobs:
                    self.settle(job, self.states[job.name])
                return True
        except StoreUnavailable as exc:
            self.logger.warning("celery-leader: cannot record a resumed entry: %s", exc)
        return False

    def load_some(self, fence: Fence, now: datetime) -> bool:
        """Load (or anchor) the next chunks of pending jobs, for up to :data:`LOAD_SLICE`
        seconds (retried at the next tick when the state cannot be loaded)."""
        sync = StateSync(self.runtime.lease, self.runtime.store.records, self.logger)
        watchdog = self.runtime.watchdog
        stop = time.monotonic() + LOAD_SLICE
        try:
            while self.pending:
                chunk = self.pending[-LOAD_CHUNK:]
                del self.pending[-LOAD_CHUNK:]
                # An entry edited or removed while pending was queued again, or is gone.
                jobs = self.jobs
                chunk = [j for j in chunk if jobs.get(j.name) is j and j.name not in self.states]
                if not chunk:
                    continue
                stored = self._stored
                if stored is None:
                    # The chunk's records alone where the store can; else all, once per load.
                    stored = sync.read([job.name for job in chunk])
                    if stored is None:
                        # The whole state, 2.5 to 8 s at a million file-store entries: a
                        # part at a time is progress, or a watchdog of 5 s (a ttl of 5 s)
                        # ended every new term within its load.
                        stored = self._stored = sync.read_all(watchdog.progress)
                        self._dropped = set()
                        watchdog.progress()
                states = sync.load(chunk, fence, now, stored)
                self.states.update(states)
                stale = []
                for job in chunk:
                    state = states[job.name]
                    self.adapter.recorded(job, state.last_run_at, state.count, False)
                    self.settle(job, state)
                    if _resumed(job, state):
                        stale.append(job)
                watchdog.progress()
                if not self._restamp(stale, fence):
                    return False
                if time.monotonic() >= stop:
                    break
        except TermEnded as exc:
            self.logger.warning("celery-leader: not dispatching: %s", exc)
            return False
        except StoreUnavailable as exc:
            # Retried every tick until the lease runs out: say it once.
            if str(exc) != self._load_error:
                self.logger.warning("celery-leader: cannot load schedule state: %s", exc)
            self._load_error = str(exc)
            return False
        self._load_error = None
        if not self.pending and self.adapter.jobs_complete():
            # Kept while a large schedule is still listed page by page: each page's new
            # names would read the whole state again (at a million file-store entries,
            # a read of up to a million states a page, ticks stuck past the watchdog).
            self._stored = None
        return True
