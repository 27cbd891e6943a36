"""The slot protocol: one implementation that Celery beat and the Dramatiq scheduler drive.

Each tick:

1. **Term.** A follower returns a short sleep and touches nothing shared. A new
   term (promotion, or the lease won back) first loads the stored state
   (:mod:`~celery_leader.schedule.sync`).
   The state is loaded in chunks, the most frequent entries first, a slice of
   time per tick: dispatching starts with the first chunk, and the watchdog
   sees each chunk as progress, so a schedule too large to load within
   ``leader_tick_timeout`` is not a hung tick.
2. **Plan.** Every job whose next slot is due gets a :class:`Batch`: the slots
   its missed-slot policy sends (:mod:`~celery_leader.schedule.policy`) and a
   claim that records the newest due slot. All arithmetic is on UTC instants.
   Jobs with a series sit in a :class:`~celery_leader.schedule.due.DueIndex`
   by next due time, so a tick looks only at what is due; a job's next due
   time is computed when it is loaded, fires or is edited. Jobs without a
   series (Celery's solar and custom schedules) are asked at every tick.
   Jobs are listed again only when the adapter says they changed
   (:meth:`~celery_leader.schedule.jobs.Adapter.jobs_changed`): a job whose
   series or ``active_since`` changed recomputes its next due time at once, a
   job that is gone is forgotten, and one that (re)appears, or comes back with
   another generation, has its state loaded (and, if re-created, anchored) anew.
3. **Claim and publish** (:mod:`~celery_leader.schedule.publisher`): one fenced
   round trip claims the whole batch; only claimed slots are published.

The tick watchdog, health file and metrics come with the lease
(:mod:`~celery_leader.schedule.runtime`). The adapter maps its own entries to
:class:`~celery_leader.schedule.jobs.Job` and its own publish to
:meth:`~celery_leader.schedule.jobs.Adapter.send`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone

from ..backends import Fence
from ..callbacks import Observer
from ..config import LeaderConfig
from ..exceptions import StoreUnavailable, TermEnded
from ..lease import Lease
from .due import DueIndex
from .jobs import Adapter, Job
from .policy import DueSlots, counted_after, due_slots, later
from .publisher import Batch, Publisher
from .resend import Resender
from .runtime import SchedulerRuntime
from .state import Claim, dump_state, slot_name
from .sync import MAX_CLOCK_SKEW, EntryState, StateSync

#: Due entries claimed (in one fenced round trip) and published per batch.
#: Between batches the leader checks its lease again, so a lost lease stops a
#: burst within one batch.
BATCH = 1000

#: Share of ``leader_tick_timeout`` a tick may spend publishing batch after
#: batch of a burst before it ends (and the next tick starts at once): entries
#: that fall due meanwhile wait for the next tick, and a tick must stay clear
#: of the watchdog, which hands the lease over after a whole timeout.
BURST_SHARE = 1 / 2
#: Entries whose state one claim round trip loads or anchors on a new term.
LOAD_CHUNK = 2000
#: Seconds of loading per tick while a new term loads its state: between slices
#: the leader dispatches what is loaded and due (a 1 s entry stays on time).
LOAD_SLICE = 0.2


def _load_order(jobs: Iterable[Job]) -> list[Job]:
    """``jobs`` in the order a new term loads them, from the end: most frequent first,
    and first of all those without a series (they may be due at any tick)."""
    return sorted(jobs, key=lambda j: 0.0 if j.series is None else j.series.spacing(), reverse=True)


def _resumed(job: Job, state: EntryState) -> bool:
    """Whether ``job`` was resumed or re-timed after its stored ``active_since``."""
    return job.active_since is not None and (
        state.active_since is None or job.active_since > state.active_since
    )


def utcnow() -> datetime:
    """The wall clock, as an aware UTC datetime."""
    return datetime.now(timezone.utc)


class SlotProtocol:
    """Runs one scheduler's side of the slot protocol; :meth:`tick` is its loop body."""

    def __init__(
        self,
        config: LeaderConfig,
        adapter: Adapter,
        logger: logging.Logger,
        *,
        idle: float,
        max_sleep: float,
        clock: Callable[[], datetime] | None = None,
        observers: Iterable[Observer] = (),
    ) -> None:
        self.config = config
        self.adapter = adapter
        self.logger = logger
        self.runtime = SchedulerRuntime(config, observers)
        #: Sleep of a follower's tick: how long a promotion goes unnoticed.
        self.idle = idle
        #: Longest sleep of a leader's tick.
        self.max_sleep = max_sleep
        #: The wall clock (aware UTC); ``None``: :meth:`now`, looked up at each tick.
        self.clock = clock
        self._epoch: int | None = None  # the term whose state is (being) loaded
        self._promoted_epoch: int | None = None
        self._promoted_at: datetime | None = None  # when this term started dispatching
        self._publisher: Publisher | None = None
        self._load_error: str | None = None
        self._last_now: datetime | None = None  # the previous tick's clock: to notice a jump back
        self._stuck_logged: set[str] = set()  # jobs whose stuck schedule was logged this term
        # Per-entry state, held only while leading (a follower holds none):
        self._jobs: dict[str, Job] = {}  # the jobs as last listed, by name
        self._states: dict[str, EntryState] = {}  # loaded state, by name
        self._due = DueIndex()  # next due times of loaded jobs with a series
        self._polled: dict[str, None] = {}  # loaded jobs without a series, in order
        self._pending: list[Job] = []  # jobs whose state is not loaded yet; the next last
        #: The store's whole state, read for _pending by stores that cannot read some keys.
        self._stored: dict[str, str] | None = None
        self._announced = False  # "dispatching as leader" logged for this load
        self._recover = False  # the run ledger's recovery waits for the load to finish

    @property
    def lease(self) -> Lease:
        """The scheduler election's lease (joined on first use)."""
        return self.runtime.lease

    def now(self) -> datetime:
        """The time slots fall due on: the store's clock as the lease measures it
        (``leader_clock = "store"``; the local one until it has, and for stores
        without a clock), else this host's."""
        if self._on_store_clock():
            return datetime.fromtimestamp(self.lease.store_clock.time(), timezone.utc)
        return utcnow()

    def _on_store_clock(self) -> bool:
        return self.config.clock == "store" and self.lease.store_clock.measured

    def tick(self) -> float:
        """One pass; returns how long to sleep. Only a current leader dispatches.

        The watchdog learns when it starts and ends: a tick that does not end
        within ``leader_tick_timeout`` makes the lease hand over.
        """
        watchdog = self.runtime.watchdog
        watchdog.tick_started()
        sleep = self._tick()
        watchdog.tick_finished(sleep)
        self.runtime.write_health()
        return sleep

    def loaded(self) -> bool:
        """Whether this scheduler leads and holds the state of every job."""
        return self._epoch is not None and not self._pending

    def close(self) -> None:
        """Hand over first (demote, release, wake a follower), then close the store."""
        self.runtime.close()

    # -- term transitions ---------------------------------------------------

    def _tick(self) -> float:
        lease = self.lease
        fence = lease.fence()
        if fence is None:
            if self._epoch is not None:
                self.logger.info(
                    "celery-leader: stopped dispatching: no longer leader of %r", lease.election
                )
                self._epoch = None
                self.adapter.demoted()
            self._forget_all()
            return self.idle
        now = (self.clock or self.now)()
        if fence.term.epoch != self._epoch:
            self._begin(fence, now)
        elif self.adapter.jobs_changed() and not self._apply(self.adapter.jobs(), fence):
            return self.idle
        if self._pending and not self._load_some(fence, now):
            return self.idle
        self._notice_clock(now)
        sleep = self._dispatch(fence, now)
        return 0.0 if self._pending else sleep

    def _forget_all(self) -> None:
        """Drop every entry's state: a follower holds none."""
        if self._jobs or self._states or self._pending:
            self._jobs, self._states, self._pending = {}, {}, []
            self._polled, self._stored = {}, None
            self._due.clear()

    def _begin(self, fence: Fence, now: datetime) -> None:
        """Start loading the state of every job for ``fence``'s term (a new one, or a reload)."""
        jobs = self.adapter.jobs()
        self.runtime.watchdog.progress()
        self._forget_all()
        self._jobs = {job.name: job for job in jobs}
        self._pending = _load_order(jobs)
        self._announced = False
        if fence.term.epoch != self._promoted_epoch:  # a new term, not a reload within one
            self._promoted_epoch = fence.term.epoch
            self._promoted_at = now
            self._stuck_logged.clear()
            lease, store = self.lease, self.runtime.store
            resender = (
                Resender(
                    lease,
                    store.runs,
                    self.adapter,
                    self.config.ledger_retention,
                    self.config.ledger_keep,
                    self.logger,
                )
                if self.config.ledger
                else None
            )
            self._publisher = Publisher(
                lease,
                store.records,
                self.adapter,
                self.config.max_publish_failures,
                self.logger,
                resender,
            )
            self._recover = resender is not None
        self._epoch = fence.term.epoch

    def _apply(self, jobs: Sequence[Job], fence: Fence) -> bool:
        """Take in the jobs as listed now: forget the gone, load the new or re-created,
        re-time the edited. False (state reloaded at the next tick) when a restamp failed.

        Gone jobs' stored state stays: a job that comes back loads it again, and
        its ``generation`` and ``active_since`` say what of it still counts.
        """
        old, self._jobs = self._jobs, {job.name: job for job in jobs}
        for name in old.keys() - self._jobs.keys():
            self._drop(name)
        fresh = False
        stale = []
        for job in jobs:
            before = old.get(job.name)
            if before is job or before == job:
                continue
            state = self._states.get(job.name)
            if state is not None and state.generation != job.generation:
                self._drop(job.name)  # re-created: its state is loaded (anchored) anew
                state = None
            if state is None:
                fresh = True
                continue
            if _resumed(job, state):
                stale.append(job)
            self._settle(job, state)
        if fresh or self._pending:
            self._pending = _load_order([j for j in jobs if j.name not in self._states])
        if fresh:
            self._stored = None  # read again: another leader may have written it since
        return self._restamp(stale, fence)

    def _drop(self, name: str) -> None:
        self._states.pop(name, None)
        self._due.discard(name)
        self._polled.pop(name, None)
        self._stuck_logged.discard(name)

    def _settle(self, job: Job, state: EntryState) -> None:
        """Put ``job`` (its state loaded, claimed or edited) where the next tick finds it."""
        if job.series is None:
            self._polled[job.name] = None
            return
        self._polled.pop(job.name, None)
        since = later(job.active_since, state.active_since)
        # A changed schedule takes effect at once: never wait out the old one.
        self._due.set(job.name, job.series.next_after(counted_after(state.last_run_at, since)))

    def _restamp(self, jobs: Sequence[Job], fence: Fence) -> bool:
        """Store the ``active_since`` of jobs resumed or re-timed since their state was
        written; False (state reloaded at the next tick) when that failed."""
        if not jobs:
            return True
        try:
            sync = StateSync(self.lease, self.runtime.store.records, self.logger)
            if sync.restamp(jobs, fence, self._states):
                for job in jobs:
                    self._settle(job, self._states[job.name])
                return True
        except StoreUnavailable as exc:
            self.logger.warning("celery-leader: cannot record a resumed entry: %s", exc)
        self._epoch = None  # reload the state before dispatching anything
        return False

    def _load_some(self, fence: Fence, now: datetime) -> bool:
        """Load (or anchor) the next chunks of pending jobs, for up to :data:`LOAD_SLICE`
        seconds. False when the state cannot be loaded (retried at the next tick)."""
        sync = StateSync(self.lease, self.runtime.store.records, self.logger)
        watchdog = self.runtime.watchdog
        stop = time.monotonic() + LOAD_SLICE
        try:
            while self._pending:
                chunk = self._pending[-LOAD_CHUNK:]
                del self._pending[-LOAD_CHUNK:]
                stored = self._stored
                if stored is None:
                    # The chunk's records alone where the store can; else all, once per load.
                    stored = sync.read([job.name for job in chunk])
                    if stored is None:
                        stored = self._stored = sync.read()
                        watchdog.progress()
                states = sync.load(chunk, fence, now, stored)
                self._states.update(states)
                stale = []
                for job in chunk:
                    state = states[job.name]
                    self.adapter.recorded(job, state.last_run_at, state.count, False)
                    self._settle(job, state)
                    if _resumed(job, state):
                        stale.append(job)
                watchdog.progress()
                if not self._restamp(stale, fence):
                    return False
                if time.monotonic() >= stop:
                    break
        except TermEnded as exc:
            self.logger.warning("celery-leader: not dispatching: %s", exc)
            self._epoch = None
            return False
        except StoreUnavailable as exc:
            # Retried every tick until the lease runs out: say it once.
            if str(exc) != self._load_error:
                self.logger.warning("celery-leader: cannot load schedule state: %s", exc)
            self._load_error = str(exc)
            self._epoch = None
            return False
        self._load_error = None
        if not self._announced:
            self._announced = True
            self.logger.info(
                "celery-leader: dispatching as leader of %r (epoch %d)",
                self.lease.election,
                fence.term.epoch,
            )
        if not self._pending:
            self._stored = None
            publisher = self._publisher
            if self._recover and publisher is not None and publisher.resender is not None:
                self._recover = False
                jobs = list(self._jobs.values())
                publisher.resender.recover(jobs, self._states, fence.term.epoch)
        return True

    def _notice_clock(self, now: datetime) -> None:
        """Say once when the clock slots run on went back (this host's, or the store's
        after a fail-over): nothing is resent, entries wait.

        Compared with the previous tick, not with the latest time seen: while the
        clock is behind every tick would repeat the warning.
        """
        previous = self._last_now
        if previous is not None and now < previous - MAX_CLOCK_SKEW:
            self.logger.warning(
                "celery-leader: the %s clock went back %.1f s (from %s to %s): slots already "
                "sent are not sent again; each entry resumes when the clock passes its last "
                "slot",
                "store's" if self._on_store_clock() else "wall",
                (previous - now).total_seconds(),
                previous.isoformat(),
                now.isoformat(),
            )
        self._last_now = now

    # -- due slots ----------------------------------------------------------

    def _dispatch(self, fence: Fence, now: datetime) -> float:
        """Claim and publish what is due, a batch at a time, while the lease and the
        tick's share of the watchdog's time last; returns how long to sleep."""
        publisher = self._publisher
        assert publisher is not None
        if publisher.resender is not None:
            publisher.resender.retry(fence.term.epoch)
        started = time.monotonic()
        ends = started + self.config.watchdog_timeout * BURST_SHARE
        # Each job without a series is asked once per tick: once sent, its
        # schedule would name the same slot again until its state is settled.
        polled = iter(list(self._polled))
        while True:
            batches, sleep = self._due_batches(fence, now, polled)
            if not batches:
                return max(0.0, sleep)
            if not self._publish(publisher, batches, fence) or len(batches) < BATCH:
                return 0.0
            # The next batch takes about as long as this one: start it only if
            # it ends within the tick's share.
            done = time.monotonic()
            if done + (done - started) > ends:
                return 0.0
            started = done

    def _due_batches(
        self, fence: Fence, now: datetime, polled: Iterator[str]
    ) -> tuple[list[Batch], float]:
        """Up to :data:`BATCH` batches, those the index says are due first, then those of
        ``polled`` jobs that are due; and how long until the next one is due."""
        batches: list[Batch] = []
        for name in self._due.pop_due(now, BATCH):
            job = self._jobs[name]
            state = self._states[name]
            batch = self._series_batch(job, state, fence, now)
            if batch is None:
                self._settle(job, state)
            else:
                batches.append(batch)
        wait = self._due.seconds_until_next(now)
        sleep = self.max_sleep if wait is None else min(self.max_sleep, wait)
        if len(batches) >= BATCH:
            return batches, 0.0
        for name in polled:
            batch, wait = self._polled_batch(self._jobs[name], self._states[name], fence, now)
            sleep = min(sleep, wait)
            if batch is not None:
                batches.append(batch)
                if len(batches) >= BATCH:
                    return batches, 0.0
        return batches, sleep

    def _publish(self, publisher: Publisher, batches: list[Batch], fence: Fence) -> bool:
        """Claim and publish ``batches``; whether the next batch may follow in this tick."""
        in_sync = publisher.run(batches, fence, self._states)
        for batch in batches:
            # Its next due time, from what the store now records (sent or handed back).
            self._settle(batch.job, self._states[batch.job.name])
        if not in_sync:
            # Someone else moved the state (or our term ended): reload it before
            # dispatching anything more.
            self._epoch = None
            return False
        current = self.lease.term
        return current is not None and current.epoch == fence.term.epoch

    def _series_batch(
        self, job: Job, state: EntryState, fence: Fence, now: datetime
    ) -> Batch | None:
        """The batch of ``job``, which the index says is due; ``None`` if it is not."""
        assert job.series is not None
        since = later(job.active_since, state.active_since)
        found = due_slots(
            job.series,
            counted_after(state.last_run_at, since),
            now,
            self._promoted_at,
            job.missed_slots,
            job.grace,
        )
        return None if found is None else self._batch(job, state, fence, now, found)

    def _polled_batch(
        self, job: Job, state: EntryState, fence: Fence, now: datetime
    ) -> tuple[Batch | None, float]:
        """The batch of a job without a series if it is due, and how long until it should
        be asked again."""
        due, wait = self.adapter.due_now(job, now)
        if due is None:
            return None, wait
        # Named to the millisecond, like every slot.
        due = due.replace(microsecond=due.microsecond // 1000 * 1000)
        if due <= state.last_run_at:
            # The schedule says due, but not after its last slot: never resent.
            # Looked at again in a second, not in a busy loop.
            self._stuck(job, due, state)
            return None, min(1.0, self.max_sleep)
        # A slot due before the job became active is recorded, never sent.
        since = later(job.active_since, state.active_since)
        early = since is not None and due < since
        chosen = DueSlots([] if early else [due], 0, due)
        return self._batch(job, state, fence, now, chosen), 0.0

    def _stuck(self, job: Job, due: datetime, state: EntryState) -> None:
        """Log once per term that ``job``'s schedule names a slot not after its last one."""
        if job.name in self._stuck_logged:
            return
        self._stuck_logged.add(job.name)
        self.logger.warning(
            "celery-leader: entry %r is due at %s, which is not after its last slot (%s): "
            "not sent again; the entry waits for its next slot",
            job.name,
            due.isoformat(),
            state.last_run_at.isoformat(),
        )

    def _batch(
        self, job: Job, state: EntryState, fence: Fence, now: datetime, chosen: DueSlots
    ) -> Batch:
        lease = self.lease
        slots = [slot_name(job.name, due, job.zone) for due in chosen.send]
        count = state.count + len(chosen.send)
        raw = dump_state(
            chosen.record,
            count,
            fence.term.epoch,
            lease.instance_id,
            slots[-1] if slots else None,
            job.generation,
            state.active_since,
        )
        after = EntryState(raw, chosen.record, count, job.generation, state.active_since)
        # The store refuses a claim whose slot is not after the state it expects:
        # the last line of defence against due-time arithmetic going backwards.
        claim = Claim(job.name, state.raw, raw, due=chosen.record)
        return Batch(job, slots, list(chosen.send), state, after, claim, chosen.dropped)
