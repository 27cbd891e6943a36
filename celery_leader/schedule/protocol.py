"""The slot protocol: one implementation that Celery beat and the Dramatiq scheduler drive.

Each tick: a follower sleeps, touching nothing shared; a new term first loads the
stored state (:class:`~celery_leader.schedule.sync.HeldJobs`); then every due job
gets a :class:`~celery_leader.schedule.publisher.Batch` (the slots its missed-slot
policy sends, and a claim recording the newest due slot), one fenced round trip
claims the whole batch, and only claimed slots are published through the adapter.
Run-now requests are claimed and published the same way, as slots outside the grid
(:mod:`~celery_leader.schedule.run_desk`).
"""

from __future__ import annotations

import logging
import time
from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone

from ..backends import Fence, StoreFacets
from ..collector import collector_paused
from ..election.events import Observer
from ..election.lease import Lease
from ..settings.config import LeaderConfig
from .entries import instant_now as utcnow  # tests set protocol.utcnow
from .jobs import Adapter, Job
from .policy import DueSlots, counted_after, due_slots, later
from .publisher import Batch, Publisher
from .resend import Resender
from .run_desk import RunDesk
from .runtime import SchedulerRuntime
from .state import Claim, dump_state, slot_name
from .sync import MAX_CLOCK_SKEW, EntryState, HeldJobs

#: Due entries claimed (in one fenced round trip) and published per batch.
#: Between batches the leader checks its lease again, so a lost lease stops a
#: burst within one batch.
BATCH = 1000

#: Share of ``leader_tick_timeout`` a tick may spend publishing batch after batch of a
#: burst: it must stay clear of the watchdog, which hands over after a whole timeout.
BURST_SHARE = 1 / 2


class Dispatcher:
    """Sends the due slots of ``held`` jobs for the term that started at ``promoted_at``."""

    def __init__(
        self,
        config: LeaderConfig,
        lease: Lease,
        store: StoreFacets,
        adapter: Adapter,
        held: HeldJobs,
        logger: logging.Logger,
        promoted_at: datetime,
        max_sleep: float,
    ) -> None:
        self.lease = lease
        self.adapter = adapter
        self.held = held
        self.logger = logger
        self.promoted_at = promoted_at
        self.max_sleep = max_sleep
        self.tick_timeout = config.watchdog_timeout
        keeping = (config.ledger_retention, config.ledger_keep, logger, config.ledger_resend_after)
        resender = Resender(lease, store.runs, adapter, *keeping) if config.ledger else None
        self.publisher = Publisher(
            lease, store.records, adapter, config.max_publish_failures, logger, resender
        )
        self.desk = RunDesk(lease, store.records, store.entries, adapter, logger, resender)
        #: The state the term loaded of each entry it has claimed since, kept until
        #: the run ledger's recovery has read it (:meth:`recover`).
        self._loaded: dict[str, EntryState] | None = None if resender is None else {}

    def run(self, fence: Fence, now: datetime) -> tuple[float, bool]:
        """Claim and publish what is due, a batch at a time, while the lease and the
        tick's share of the watchdog's time last: how long to sleep, and False when
        the held state went stale (someone else moved it, or our term ended)."""
        publisher = self.publisher
        if publisher.resender is not None:
            publisher.resender.retry(fence.term.epoch)
            publisher.resender.unstarted(self.held.jobs, fence.term.epoch)
        if not self.held.pending:
            # Once the term's state is loaded: the run ledger's recovery, at the end
            # of the load, starts the re-sends of the term afresh.
            self.desk.run(fence, now)
        started = time.monotonic()
        ends = started + self.tick_timeout * BURST_SHARE
        # Each job without a series is asked once per tick: once sent, its
        # schedule would name the same slot again until its state is settled.
        polled = iter(list(self.held.polled))
        while True:
            batches, sleep = self._due_batches(fence, now, polled)
            if not batches:
                return max(0.0, sleep), True
            in_sync = publisher.run(batches, fence, self.held.states)
            if self._loaded is not None:
                for batch in batches:
                    self._loaded.setdefault(batch.job.name, batch.before)
            for batch in batches:
                # Its next due time, from what the store now records (sent or handed back).
                self.held.settle(batch.job, self.held.states[batch.job.name])
            current = self.lease.term
            if not in_sync or current is None or current.epoch != fence.term.epoch:
                return 0.0, in_sync
            if len(batches) < BATCH:
                return 0.0, True
            # The next batch takes about as long as this one: start it only if
            # it ends within the tick's share.
            done = time.monotonic()
            if done + (done - started) > ends:
                return 0.0, True
            started = done

    def recover(self, epoch: int) -> None:
        """The run ledger's recovery for a new term: re-send each entry's last slot claimed
        before the term, if it left no trace. It runs after the term's first dispatch
        (its store calls, four round trips and more, would otherwise delay what is due),
        so it reads the state of entries claimed since as the term loaded it."""
        resender = self.publisher.resender
        loaded, self._loaded = self._loaded or {}, None
        if resender is not None:
            jobs = list(self.held.jobs.values())
            resender.recover(jobs, ChainMap(loaded, self.held.states), epoch)

    def _due_batches(
        self, fence: Fence, now: datetime, polled: Iterator[str]
    ) -> tuple[list[Batch], float]:
        """Up to :data:`BATCH` batches, those the index says are due first, then those of
        ``polled`` jobs that are due; and how long until the next one is due."""
        held = self.held
        batches: list[Batch] = []
        for name in held.due.pop_due(now, BATCH):
            job, state = held.jobs[name], held.states[name]
            batch = self._series_batch(job, state, fence, now)
            if batch is None:
                held.settle(job, state)
            else:
                batches.append(batch)
        wait = held.due.seconds_until_next(now)
        sleep = self.max_sleep if wait is None else min(self.max_sleep, wait)
        if len(batches) >= BATCH:
            return batches, 0.0
        for name in polled:
            batch, wait = self._polled_batch(held.jobs[name], held.states[name], fence, now)
            sleep = min(sleep, wait)
            if batch is not None:
                batches.append(batch)
                if len(batches) >= BATCH:
                    return batches, 0.0
        return batches, sleep

    def _series_batch(
        self, job: Job, state: EntryState, fence: Fence, now: datetime
    ) -> Batch | None:
        """The batch of ``job``, which the index says is due; ``None`` if it is not."""
        assert job.series is not None
        since = later(job.active_since, state.active_since)
        last = counted_after(state.last_run_at, since)
        found = due_slots(job.series, last, now, self.promoted_at, job.missed_slots, job.grace)
        return None if found is None else self._batch(job, state, fence, found)

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
            # The schedule says due, but not after its last slot: never resent, and
            # said once per term. Looked at again in a second, not in a busy loop.
            if job.name not in self.held.stuck:
                self.held.stuck.add(job.name)
                msg = (
                    "celery-leader: entry %r is due at %s, which is not after its last slot "
                    "(%s): not sent again; the entry waits for its next slot"
                )
                self.logger.warning(msg, job.name, due.isoformat(), state.last_run_at.isoformat())
            return None, min(1.0, self.max_sleep)
        # A slot due before the job became active is recorded, never sent.
        since = later(job.active_since, state.active_since)
        early = since is not None and due < since
        chosen = DueSlots([] if early else [due], 0, due)
        return self._batch(job, state, fence, chosen), 0.0

    def _batch(self, job: Job, state: EntryState, fence: Fence, chosen: DueSlots) -> Batch:
        slots = [slot_name(job.name, due, job.zone) for due in chosen.send]
        count = state.count + len(chosen.send)
        slot = slots[-1] if slots else None
        by, since = self.lease.instance_id, state.active_since
        raw = dump_state(chosen.record, count, fence.term.epoch, by, slot, job.generation, since)
        writer = (fence.term.epoch, by)
        after = EntryState.write(chosen.record, count, writer, slot, job.generation, since)
        # The store refuses a claim whose slot is not after the state it expects:
        # the last line of defence against due-time arithmetic going backwards.
        claim = Claim(job.name, state.raw, raw, due=chosen.record)
        return Batch(job, slots, list(chosen.send), state, after, claim, chosen.dropped)


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
        #: The jobs and their state, held only while leading.
        self.held = HeldJobs(self.runtime, adapter, logger)
        self._epoch: int | None = None  # the term whose state is (being) loaded
        self._promoted_epoch: int | None = None
        self._dispatcher: Dispatcher | None = None  # the current term's
        self._last_now: datetime | None = None  # the previous tick's clock: to notice a jump back
        self._announced = False  # "dispatching as leader" logged for this load
        self._recover = False  # the run ledger's recovery waits for the load to finish
        self._loaded_said = False  # "loaded the state" logged for this term
        self._term_started = 0.0  # when this term began loading (monotonic)

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
        """One pass; returns how long to sleep. Only a current leader dispatches. A tick
        that does not end within ``leader_tick_timeout`` makes the watchdog hand over."""
        watchdog = self.runtime.watchdog
        watchdog.tick_started()
        sleep = self._tick()
        watchdog.tick_finished(sleep)
        self.runtime.write_health()
        return sleep

    def loaded(self) -> bool:
        """Whether this scheduler leads and holds the state of every job."""
        return self._epoch is not None and not self.held.pending

    def close(self) -> None:
        """Hand over first (demote, release, wake a follower), then close the store."""
        self.runtime.close()

    def _tick(self) -> float:
        lease = self.lease
        fence = lease.fence()
        held = self.held
        if fence is None:
            if self._epoch is not None:
                self.logger.info(
                    "celery-leader: stopped dispatching: no longer leader of %r", lease.election
                )
                self._epoch = None
                self.adapter.demoted()
            held.clear()
            return self.idle
        now = (self.clock or self.now)()
        if fence.term.epoch != self._epoch:
            with collector_paused():  # a million jobs listed and ordered at once
                self._begin(fence, now)
        elif self.adapter.jobs_changed() and not self._take_changes(fence):
            self._epoch = None  # reload the state before dispatching anything
            return self.idle
        dispatcher = self._dispatcher
        assert dispatcher is not None  # made by the term's first _begin
        if held.pending:
            if not held.load_some(fence, now):
                self._epoch = None
                return self.idle
            if not self._announced:
                self._announced = True
                what = "celery-leader: dispatching as leader of %r (epoch %d)"
                self.logger.info(what, lease.election, fence.term.epoch)
        # All loaded on a new term, and every entry listed (a large schedule is read
        # page by page): once what is due now is sent, the run ledger re-sends what
        # the previous leader may not have sent.
        recover = self._recover and not held.pending and self.adapter.jobs_complete()
        if recover and not self._loaded_said:
            self._loaded_said = True
            self.logger.info(
                "celery-leader: loaded the state of %d entries in %.1f s (epoch %d)",
                len(held.states),
                time.monotonic() - self._term_started,
                fence.term.epoch,
            )
        self._notice_clock(now)
        sleep, in_sync = dispatcher.run(fence, now)
        if not in_sync:
            # Someone else moved the state (or our term ended): reload it before
            # dispatching anything more (and recovering: after the reload).
            self._epoch = None
        elif recover:
            self._recover = False
            dispatcher.recover(fence.term.epoch)
        return 0.0 if held.pending else sleep

    def _take_changes(self, fence: Fence) -> bool:
        """Take in the jobs that changed: only those where the adapter can tell."""
        edits = self.adapter.job_edits()
        if edits is None:
            return self.held.apply(self.adapter.jobs(), fence)
        return self.held.apply_edits(edits, fence)

    def _begin(self, fence: Fence, now: datetime) -> None:
        """Start loading the state of every job for ``fence``'s term (a new one, or a reload)."""
        jobs = self.adapter.jobs()
        self.runtime.watchdog.progress()
        self.held.begin(jobs)
        self._announced = False
        if fence.term.epoch != self._promoted_epoch:  # a new term, not a reload within one
            self._promoted_epoch = fence.term.epoch
            self.held.stuck.clear()
            parts = (self.lease, self.runtime.store, self.adapter, self.held, self.logger)
            self._dispatcher = Dispatcher(self.config, *parts, now, self.max_sleep)
            self._recover = True
            self._loaded_said = False
            self._term_started = time.monotonic()
        self._epoch = fence.term.epoch

    def _notice_clock(self, now: datetime) -> None:
        """Say once when the clock slots run on went back (this host's, or the store's after a
        fail-over): nothing is resent, entries wait. Compared with the previous tick, not the
        latest time seen, or every tick behind would repeat the warning."""
        previous = self._last_now
        if previous is not None and now < previous - MAX_CLOCK_SKEW:
            msg = (
                "celery-leader: the %s clock went back %.1f s (from %s to %s): slots already "
                "sent are not sent again; each entry resumes when the clock passes its last "
                "slot"
            )
            clock = "store's" if self._on_store_clock() else "wall"
            back = ((previous - now).total_seconds(), previous.isoformat(), now.isoformat())
            self.logger.warning(msg, clock, *back)
        self._last_now = now
