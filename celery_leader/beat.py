"""Beat on every replica, one dispatcher, no schedule slot sent twice.

:class:`LeaderSchedulerMixin` gates any Celery scheduler on a lease:

* A follower's ``tick()`` returns a short sleep and touches nothing shared.
* On promotion the leader reloads the shared schedule state (``last_run_at``
  and ``total_run_count`` per entry, JSON in the lease's store) and rebuilds
  its heap, so it continues where the previous leader stopped.
* Before publishing, the leader *claims* every due slot with one fenced
  compare-and-set in the store: "my term is current and the entry's stored
  state is the one I read". Claims of all due entries go in one round trip.
  Only a claimed slot is published, so a slot goes out at most once even if
  a paused or cut-off ex-leader still believes it leads.
"""

from __future__ import annotations

import copy
import heapq
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .backends import Backend, Claim, create_backend
from .config import LeaderConfig
from .exceptions import StoreUnavailable, missing_extra
from .lease import Lease
from .signals import elected as _elected  # noqa: F401 - importing it connects the signals
from .slots import dump_state, slot_name
from .slots import parse_state as _parse_state

try:
    from celery.beat import ScheduleEntry, Scheduler, event_t
    from celery.schedules import crontab, schedule
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

logger = logging.getLogger("celery_leader.beat")

#: How often a follower's beat looks at its lease (a local clock compare, no
#: I/O). It bounds how long a promotion goes unnoticed, which is the part of
#: a hand-over that the lease does not decide: 0.1 s keeps a graceful
#: hand-over (release + wake-up + this) well under half a second.
FOLLOWER_INTERVAL = 0.1

#: Due entries claimed and published per tick. Between batches the leader
#: checks its lease again, so a lost lease stops a burst within one batch.
BATCH = 1000


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
    _heap: list[Any] | None
    old_schedulers: Any
    producer: Any

    if TYPE_CHECKING:

        def populate_heap(self) -> None: ...
        def schedules_equal(self, old: Any, new: Any) -> bool: ...
        def _when(self, entry: ScheduleEntry, next_time_to_run: float) -> float: ...
        def is_due(self, entry: ScheduleEntry) -> tuple[bool, float]: ...
        def _is_due_failed(self, entry: ScheduleEntry) -> tuple[bool, float]: ...
        def reserve(self, entry: ScheduleEntry) -> ScheduleEntry: ...
        def apply_async(
            self, entry: ScheduleEntry, producer: Any = ..., advance: bool = ...
        ) -> Any: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        app = kwargs.get("app", args[0] if args else None)
        # Validate at start-up, so bad settings fail before beat runs.
        self.leader_config = LeaderConfig.from_app(app)
        self._backend: Backend | None = None
        self._lease: Lease | None = None
        self._led_epoch: int | None = None  # epoch whose state we loaded
        self._shared: dict[str, str] = {}  # entry -> state string last seen in the store
        self._set_up = False
        self._load_error: str | None = None
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        """Deferred until this instance first leads.

        Some schedulers write shared state while setting up (django-celery-beat
        saves ``beat_schedule`` into its tables); only a leader may do that.
        """

    # -- lease --------------------------------------------------------------

    @property
    def lease(self) -> Lease:
        """The beat election's lease, joined on first use."""
        if self._lease is None:
            config = self.leader_config
            self._backend = create_backend(config)
            self._lease = Lease.from_config(config.beat_election, config, self._backend)
            self._lease.start()
        return self._lease

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One scheduler pass; only a current leader dispatches."""
        lease = self.lease
        tenure = lease.tenure
        if tenure is None:
            if self._led_epoch is not None:
                logger.info(
                    "celery-leader: beat stopped dispatching: no longer leader of %r",
                    lease.election,
                )
                self._led_epoch = None
            return min(FOLLOWER_INTERVAL, self.max_interval)
        if tenure.epoch != self._led_epoch:
            try:
                if not self._set_up:
                    super().setup_schedule()  # type: ignore[misc]
                    self._set_up = True
                self._load_shared_state()
            except StoreUnavailable as exc:
                # Retried every tick until the lease runs out: say it once.
                if str(exc) != self._load_error:
                    logger.warning("celery-leader: cannot load schedule state: %s", exc)
                self._load_error = str(exc)
                return FOLLOWER_INTERVAL
            self._load_error = None
            self._led_epoch = tenure.epoch
            logger.info(
                "celery-leader: beat dispatching as leader of %r (epoch %d)",
                lease.election,
                tenure.epoch,
            )
        return self._leader_tick()

    def _load_shared_state(self) -> None:
        """Adopt the stored state of every entry and rebuild the heap.

        An entry the store has no state for (new, or the store lost its data) is
        anchored at now, and the anchor is claimed before anything is sent: our
        own memory of such an entry may be older than what other leaders sent
        since (resending their slots), and a successor that found nothing stored
        would start the entry from its own promotion (skipping a slot that fell
        due during the hand-over).
        """
        lease = self.lease
        tenure = lease.tenure
        if tenure is None:
            raise StoreUnavailable("lost the lease before loading the schedule state")
        stored = lease.backend.load_state(lease.election)
        self._shared = stored
        anchors = []
        for entry in self.schedule.values():
            if entry.name in stored:
                self._adopt(entry, promoted=True)
                continue
            self.set_run_state(entry, entry.default_now(), entry.total_run_count)
            anchors.append(
                Claim(
                    entry.name,
                    None,
                    _dump_state(entry, tenure.epoch, lease.instance_id),
                )
            )
        if anchors:
            won = lease.backend.claim(lease.election, tenure, anchors)
            if not all(won):
                raise StoreUnavailable("the schedule state changed while loading it")
            self._shared.update((claim.entry, claim.new) for claim in anchors)
        self._heap = None  # rebuilt from the adopted state

    def _adopt(self, entry: ScheduleEntry, promoted: bool = False) -> None:
        """Take the stored run state of ``entry``: always on promotion, later when newer.

        On promotion the store is the truth (our local entries were made when
        we set up, not when the entry last ran). Later, schedulers that re-read
        their entries (django-celery-beat reloads rows whose ``last_run_at`` is
        written lazily) would otherwise see a slot as due that was already sent.
        """
        raw = self._shared.get(entry.name)
        if raw is None:
            return
        state = _parse_state(raw)
        if state is None:
            if promoted:
                logger.error(
                    "celery-leader: ignoring unreadable schedule state of %r: %.100r "
                    "(it is overwritten at the entry's next run)",
                    entry.name,
                    raw,
                )
            return
        last_run_at, total_run_count = state
        if promoted or entry.last_run_at is None or last_run_at > entry.last_run_at:
            self.set_run_state(entry, last_run_at, total_run_count)

    def set_run_state(self, entry: ScheduleEntry, last_run_at: datetime, count: int) -> None:
        """Set ``last_run_at`` and ``total_run_count`` of ``entry`` (a hook)."""
        entry.last_run_at = last_run_at
        entry.total_run_count = count

    # -- dispatch -----------------------------------------------------------

    def _leader_tick(self) -> float:
        if self._heap is None or not self.schedules_equal(self.old_schedulers, self.schedule):
            self.old_schedulers = copy.copy(self.schedule)
            self.populate_heap()
        heap = self._heap
        assert heap is not None
        if not heap:
            return self.max_interval
        due: list[tuple[Any, ScheduleEntry, float]] = []
        later: list[Any] = []
        while heap and len(due) < BATCH:
            event = heap[0]
            entry = event[2]
            if event[0] > self._when(entry, 0):
                break
            heapq.heappop(heap)
            self._adopt(entry)
            try:
                is_due, next_time = self.is_due(entry)
            except Exception:
                is_due, next_time = self._is_due_failed(entry)
            if is_due:
                due.append((event, entry, next_time))
            else:
                later.append(event_t(self._when(entry, next_time), event[1], entry))
        for event in later:
            heapq.heappush(heap, event)
        if not due:
            return min(float(heap[0][0]) - self._when(heap[0][2], 0), self.max_interval)
        self._dispatch(due)
        return 0.0

    def _dispatch(self, due: list[tuple[Any, ScheduleEntry, float]]) -> None:
        lease = self.lease
        tenure = lease.tenure
        heap = self._heap
        assert heap is not None
        if tenure is None:  # lost the lease while collecting: leave the heap as it was
            for event, _, _ in due:
                heapq.heappush(heap, event)
            return
        slots, claims, nexts = [], [], []
        for _, entry, _ in due:
            slot = slot_name(entry.name, _due_time(entry))
            next_entry = self.reserve(entry)
            new = _dump_state(next_entry, tenure.epoch, lease.instance_id, slot)
            slots.append(slot)
            nexts.append(next_entry)
            claims.append(Claim(entry.name, self._shared.get(entry.name), new))
        try:
            won = lease.backend.claim(lease.election, tenure, claims)
        except StoreUnavailable as exc:
            logger.warning("celery-leader: claims failed, nothing sent: %s", exc)
            won = [False] * len(claims)
        lost_any = False
        for (event, _, next_time), slot, claim, next_entry, ok in zip(
            due, slots, claims, nexts, won, strict=True
        ):
            heapq.heappush(heap, event_t(self._when(next_entry, next_time), event[1], next_entry))
            if not ok:
                lost_any = True
                logger.warning("celery-leader: slot %s not claimed; not sending it", slot)
                continue
            self._shared[claim.entry] = claim.new
            self._publish(next_entry, slot, tenure.epoch)
        if lost_any:
            # Someone else moved the state (or our term ended): reload it
            # before dispatching anything more.
            self._led_epoch = None

    def _publish(self, entry: ScheduleEntry, slot: str, epoch: int) -> None:
        logger.info(
            "Scheduler: Sending due task %s (%s) slot %s epoch %d",
            entry.name,
            entry.task,
            slot,
            epoch,
        )
        # Celery's apply_async reads the headers from entry.options; swap in a
        # copy for this one call so they never stick to the entry (or its model
        # row). Entries are not copied: django-celery-beat's cannot be.
        options = entry.options
        headers = {**options.get("headers", {}), "leader_epoch": epoch, "leader_slot": slot}
        entry.options = {**options, "headers": headers}
        try:
            self.apply_async(entry, producer=self.producer, advance=False)
        except Exception as exc:
            # The slot stays claimed: it is not sent twice, and the entry runs
            # again at its next slot.
            logger.error("celery-leader: could not send slot %s: %s", slot, exc, exc_info=True)
        finally:
            entry.options = options

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Hand over first (demote, release, wake a follower), then close the scheduler.

        Safe to call twice: beat does on SIGTERM.
        """
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.stop()
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        super().close()  # type: ignore[misc]

    @property
    def info(self) -> str:
        """Banner lines of ``celery beat``: the store (password masked) and election."""
        config = self.leader_config
        base = super().info  # type: ignore[misc]
        lines = [base] if base else []
        lines.append(
            f"    . leader store -> {config.display_url}\n"
            f"    . leader election -> {config.beat_election} (ttl {config.ttl:g} s, "
            f"renew every {config.renew_interval:g} s, instance {config.instance_id})"
        )
        return "\n".join(lines)


class LeaderScheduler(LeaderSchedulerMixin, Scheduler):  # type: ignore[misc]
    """Celery's in-memory scheduler, gated on the beat election.

    Schedule state lives in the lease store, so unlike ``PersistentScheduler``
    no local shelve file is written (replicas on one host would fight over
    it) and a new leader continues where the old one stopped.
    """


def _due_time(entry: ScheduleEntry) -> datetime:
    """When the slot being fulfilled was due (stable across replicas).

    Computed from ``last_run_at`` alone where the schedule allows it: ``now +
    remaining_estimate()`` reads the clock twice, microseconds apart, and names the
    slot a hair before its due time (``...:59.999`` for a crontab's ``:00``).
    """
    sched = entry.schedule
    if isinstance(sched, crontab):
        start, ends_in, _ = sched.remaining_delta(entry.last_run_at)
        return start + ends_in  # type: ignore[no-any-return]
    if isinstance(sched, schedule) and not sched.relative:
        return sched.maybe_make_aware(entry.last_run_at) + sched.run_every  # type: ignore[no-any-return]
    now = entry.default_now()
    try:
        return now + sched.remaining_estimate(entry.last_run_at)  # type: ignore[no-any-return]
    except (AttributeError, NotImplementedError):
        return now  # type: ignore[no-any-return]


def _dump_state(entry: ScheduleEntry, epoch: int, by: str, slot: str | None = None) -> str:
    """The shared state of ``entry`` as stored (see :func:`celery_leader.slots.dump_state`)."""
    return dump_state(entry.last_run_at, entry.total_run_count, epoch, by, slot)
