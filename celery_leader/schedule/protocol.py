"""The slot protocol: one implementation that Celery beat and the Dramatiq scheduler drive.

Each tick:

1. **Term.** A follower returns a short sleep and touches nothing shared. A new
   term (promotion, or the lease won back) first loads the stored state
   (:mod:`~celery_leader.schedule.sync`).
2. **Plan.** Every job whose next slot is due gets a :class:`Batch`: the slots
   its missed-slot policy sends (:mod:`~celery_leader.schedule.policy`) and a
   claim that records the newest due slot. All arithmetic is on UTC instants.
   Jobs may change between ticks: a job whose series or ``active_since``
   changed recomputes its next due time at once, a job that is gone is
   forgotten, and one that (re)appears, or comes back with another
   generation, has its state loaded (and, if re-created, anchored) anew.
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
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone

from .. import metrics
from ..backends import Term
from ..callbacks import Observer
from ..config import LeaderConfig
from ..exceptions import StoreUnavailable, TermEnded
from ..lease import Lease
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
#: batch of a burst before it ends (and the next one starts at once). Each tick
#: walks the whole schedule (about 1 s at 100,000 entries), so a longer share
#: costs less per slot; but entries that fall due meanwhile wait for the next
#: tick, and a tick must stay clear of the watchdog.
BURST_SHARE = 1 / 2


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
        self._epoch: int | None = None  # the term whose state is loaded
        self._promoted_epoch: int | None = None
        self._promoted_at: datetime | None = None  # when this term started dispatching
        self._states: dict[str, EntryState] = {}
        self._publisher: Publisher | None = None
        self._load_error: str | None = None
        self._last_now: datetime | None = None  # the previous tick's clock: to notice a jump back
        self._stuck_logged: set[str] = set()  # jobs whose stuck schedule was logged this term

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

    def close(self) -> None:
        """Hand over first (demote, release, wake a follower), then close the store."""
        self.runtime.close()

    # -- term transitions ---------------------------------------------------

    def _tick(self) -> float:
        lease = self.lease
        term = lease.term
        if term is None:
            if self._epoch is not None:
                self.logger.info(
                    "celery-leader: stopped dispatching: no longer leader of %r", lease.election
                )
                self._epoch = None
                self.adapter.demoted()
            return self.idle
        jobs = self.adapter.jobs()
        now = (self.clock or self.now)()
        self._forget_gone(jobs)
        if term.epoch != self._epoch or any(self._unknown(job) for job in jobs):
            if not self._load(jobs, term, now):
                return self.idle
        self._notice_clock(now)
        if not self._restamp(jobs, term):
            return self.idle
        return self._dispatch(jobs, term, now)

    def _forget_gone(self, jobs: Sequence[Job]) -> None:
        """Drop the memory of jobs no longer in the schedule (removed, paused, disabled).

        Their stored state stays: a job that comes back loads it again, and its
        ``generation`` and ``active_since`` say what of it still counts.
        """
        names = {job.name for job in jobs}
        for name in [name for name in self._states if name not in names]:
            del self._states[name]
            self._stuck_logged.discard(name)

    def _unknown(self, job: Job) -> bool:
        """Whether ``job``'s state must be loaded: new to this leader, or re-created."""
        state = self._states.get(job.name)
        return state is None or state.generation != job.generation

    def _restamp(self, jobs: Sequence[Job], term: Term) -> bool:
        """Store the ``active_since`` of jobs resumed or re-timed since their state was
        written; False (state reloaded at the next tick) when that failed."""
        stale = []
        for job in jobs:
            stored = self._states[job.name].active_since
            if job.active_since is not None and (stored is None or job.active_since > stored):
                stale.append(job)
        if not stale:
            return True
        try:
            if StateSync(self.lease, self.logger).restamp(stale, term, self._states):
                return True
        except StoreUnavailable as exc:
            self.logger.warning("celery-leader: cannot record a resumed entry: %s", exc)
        self._epoch = None  # reload the state before dispatching anything
        return False

    def _load(self, jobs: Sequence[Job], term: Term, now: datetime) -> bool:
        lease = self.lease
        try:
            self._states = StateSync(lease, self.logger).load(jobs, term, now)
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
        for job in jobs:
            state = self._states[job.name]
            self.adapter.recorded(job, state.last_run_at, state.count, False)
        if term.epoch != self._epoch:
            if term.epoch != self._promoted_epoch:  # a new term, not a reload within one
                self._promoted_epoch = term.epoch
                self._promoted_at = now
                self._stuck_logged.clear()
                resender = (
                    Resender(lease, self.adapter, self.config.ledger_retention, self.logger)
                    if self.config.ledger
                    else None
                )
                self._publisher = Publisher(
                    lease, self.adapter, self.config.max_publish_failures, self.logger, resender
                )
                if resender is not None:
                    resender.recover(list(jobs), self._states, term.epoch)
            self.logger.info(
                "celery-leader: dispatching as leader of %r (epoch %d)",
                lease.election,
                term.epoch,
            )
        self._epoch = term.epoch
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

    def _dispatch(self, jobs: Sequence[Job], term: Term, now: datetime) -> float:
        """Claim and publish what is due, a batch at a time, while the lease and the
        tick's share of the watchdog's time last; returns how long to sleep."""
        publisher = self._publisher
        assert publisher is not None
        if publisher.resender is not None:
            publisher.resender.retry(term.epoch)
        started = time.monotonic()
        ends = started + self.config.watchdog_timeout * BURST_SHARE
        batches: list[Batch] = []
        sleep = self.max_sleep
        published = False
        for job in jobs:
            batch, wait = self._due_batch(job, self._states[job.name], term, now)
            sleep = min(sleep, wait)
            if batch is None:
                continue
            batches.append(batch)
            if len(batches) < BATCH:
                continue
            published = True
            if not self._publish(publisher, batches, term):
                return 0.0
            # The next batch takes about as long as this one: start it only if
            # it ends within the tick's share.
            done = time.monotonic()
            if done + (done - started) > ends:
                return 0.0
            started, batches = done, []
        if batches:
            self._publish(publisher, batches, term)
            return 0.0
        return 0.0 if published else max(0.0, sleep)

    def _publish(self, publisher: Publisher, batches: list[Batch], term: Term) -> bool:
        """Claim and publish ``batches``; whether the next batch may follow in this tick."""
        if not publisher.run(batches, term, self._states):
            # Someone else moved the state (or our term ended): reload it before
            # dispatching anything more.
            self._epoch = None
            return False
        current = self.lease.term
        return current is not None and current.epoch == term.epoch

    def _due_batch(
        self, job: Job, state: EntryState, term: Term, now: datetime
    ) -> tuple[Batch | None, float]:
        """The batch of ``job`` if it is due, and how long until it should be looked at again."""
        if job.series is None:
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
        else:
            since = later(job.active_since, state.active_since)
            after = counted_after(state.last_run_at, since)
            if (
                state.next_due is None
                or state.due_since != since
                or state.due_series is None
                or state.due_series.key() != job.series.key()
            ):
                # A changed schedule takes effect at once: never wait out the old one.
                state.next_due = job.series.next_after(after)
                state.due_series, state.due_since = job.series, since
            if state.next_due is None:
                return None, self.max_sleep  # the series has ended
            if state.next_due > now:
                return None, (state.next_due - now).total_seconds()
            found = due_slots(
                job.series, after, now, self._promoted_at, job.missed_slots, job.grace
            )
            if found is None:  # a series whose next slot moved (it cannot, but be safe)
                state.next_due = None
                return None, 0.0
            chosen = found
        return self._batch(job, state, term, now, chosen), 0.0

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
        self, job: Job, state: EntryState, term: Term, now: datetime, chosen: DueSlots
    ) -> Batch:
        lease = self.lease
        slots = [slot_name(job.name, due, job.zone) for due in chosen.send]
        if chosen.dropped:
            grace = job.grace
            self.logger.info(
                "celery-leader: not sending %d missed slot(s) of %r, the last due %s "
                "(leader_missed_slots %s%s)",
                chosen.dropped,
                job.name,
                slot_name(job.name, chosen.record, job.zone).partition("@")[2],
                job.missed_slots,
                "" if grace is None else f", grace {grace:g} s",
            )
            metrics.count("missed_slots_dropped", lease.election, chosen.dropped)
        count = state.count + len(chosen.send)
        raw = dump_state(
            chosen.record,
            count,
            term.epoch,
            lease.instance_id,
            slots[-1] if slots else None,
            job.generation,
            state.active_since,
        )
        after = EntryState(raw, chosen.record, count, job.generation, state.active_since)
        # The store refuses a claim whose slot is not after the state it expects:
        # the last line of defence against due-time arithmetic going backwards.
        claim = Claim(job.name, state.raw, raw, due=chosen.record)
        return Batch(job, slots, list(chosen.send), state, after, claim)
