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
* A leader that cannot dispatch steps down: the lease stops renewing when a
  tick has not finished within ``leader_tick_timeout``, and the leader resigns
  after ``leader_max_publish_failures`` failed publishes in a row. A slot that
  definitely did not reach the broker is handed back (a fenced compare-and-set
  back to the state before the claim), so the next leader sends it; a slot
  whose outcome is unknown stays claimed.
* Slots are sent through ``Scheduler.apply_entry``, so code that hooks it
  (sentry-sdk's Crons) sees every slot with its headers.
"""

from __future__ import annotations

import copy
import heapq
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .. import metrics
from ..backends import Backend, Claim, Tenure, create_backend
from ..config import LeaderConfig, validate_grace, validate_missed_slots
from ..exceptions import ConfigError, StoreUnavailable, missing_extra
from ..health import HealthFile, Watchdog
from ..lease import Lease
from ..schedule.state import dump_state, slot_name
from ..schedule.state import parse_state as _parse_state
from . import publishing
from .signals import elected as _elected  # noqa: F401 - importing it connects the signals

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

#: A stored ``last_run_at`` later than now plus this is not adopted (a replica
#: whose clock ran ahead wrote it): the entry would never be due again.
MAX_CLOCK_SKEW = 1.0

#: ``leader_missed_slots = "all"`` sends at most this many missed slots of an
#: entry at once; older ones are dropped (and logged).
MAX_MISSED = 100
#: Crontab slots looked at, at most, to find the missed ones of one entry.
_MAX_CRON_STEPS = 10_000

#: A slot handed back after a failed publish is retried after this long.
RETRY_AFTER = 1.0

#: Entry options read by the scheduler, never passed on to ``apply_async``.
ENTRY_OPTIONS = ("leader_missed_slots", "leader_missed_slots_grace")


@dataclass
class _Plan:
    """What one due entry sends in this tick, and the state that records it."""

    event: Any
    entry: ScheduleEntry
    next_entry: ScheduleEntry
    slots: list[str]  # to send, oldest first
    dues: list[datetime]  # their due times
    previous: tuple[datetime | None, int]  # (last_run_at, total_run_count) before the claim
    claim: Claim
    next_time: float
    sent: list[str] = field(default_factory=list)


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
        def apply_entry(self, entry: ScheduleEntry, producer: Any = ...) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        app = kwargs.get("app", args[0] if args else None)
        # Validate at start-up, so bad settings fail before beat runs.
        self.leader_config = LeaderConfig.from_app(app)
        if self.leader_config.metrics_port is not None:
            metrics.require()
        self._backend: Backend | None = None
        self._lease: Lease | None = None
        self._led_epoch: int | None = None  # epoch whose state we loaded
        self._shared: dict[str, str] = {}  # entry -> state string last seen in the store
        self._set_up = False
        self._load_error: str | None = None
        self._promoted_at: datetime | None = None  # when this term started dispatching
        self._failed_publishes = 0  # in a row
        self._bad_options: set[str] = set()  # entries whose leader_* options were refused
        self._promoted_epoch: int | None = None
        self._watchdog = Watchdog(self.leader_config.watchdog_timeout)
        self._sending = False  # inside _send: apply_async keeps its error
        self._send_error: BaseException | None = None
        self._health: HealthFile | None = None
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
            if config.metrics_port is not None:
                metrics.serve(config.metrics_port)
            self._backend = create_backend(config)
            lease = Lease.from_config(config.beat_election, config, self._backend)
            lease.health_check = self._watchdog.overdue
            if config.health_file is not None:
                self._health = HealthFile(config.health_file, lease, self._watchdog)
                lease.on_cycle = self._lease_cycle
            metrics.track(lease)
            self._lease = lease
            lease.start()
        return self._lease

    def _lease_cycle(self, lease: Lease) -> None:
        if self._health is not None:
            self._health.write(force=False)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One scheduler pass; only a current leader dispatches.

        The watchdog learns when it starts and ends: a tick that does not end
        within ``leader_tick_timeout`` makes the lease hand over.
        """
        self._watchdog.tick_started()
        interval = self._tick()
        self._watchdog.tick_finished(interval)
        if self._health is not None:
            self._health.write(force=False)
        return interval

    def _tick(self) -> float:
        lease = self.lease
        tenure = lease.tenure
        if tenure is None:
            if self._led_epoch is not None:
                logger.info(
                    "celery-leader: beat stopped dispatching: no longer leader of %r",
                    lease.election,
                )
                self._led_epoch = None
                self._failed_publishes = 0
                self._release_broker()
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
            if tenure.epoch != self._promoted_epoch:  # a new term, not a reload within one
                self._promoted_epoch = tenure.epoch
                self._promoted_at = self.app.now()
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
        with lease.observe("load_state"):
            stored = lease.backend.load_state(lease.election)
        self._shared = stored
        anchors = []
        for entry in self.schedule.values():
            if entry.name in stored:
                self._adopt(entry, promoted=True)
                continue
            self.set_run_state(entry, _anchor(entry), entry.total_run_count)
            anchors.append(
                Claim(
                    entry.name,
                    None,
                    _dump_state(entry, tenure.epoch, lease.instance_id),
                )
            )
        if anchors:
            with lease.observe("claim"):
                won = lease.backend.claim(lease.election, tenure, anchors)
            if not any(won):
                # Every claim fails at once only when the term is no longer current.
                raise StoreUnavailable(
                    f"the term (epoch {tenure.epoch}) ended while loading the schedule state"
                )
            if not all(won):
                raise StoreUnavailable(
                    "another leader wrote the schedule state while this one loaded it"
                )
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
        now = entry.default_now()
        if _aware(entry, last_run_at) > _aware(entry, now) + timedelta(seconds=MAX_CLOCK_SKEW):
            if promoted:
                # Adopted, it would keep the entry from ever being due here. The
                # next claim overwrites the stored value.
                repaired = _anchor(entry)
                logger.warning(
                    "celery-leader: entry %r has a stored last_run_at in the future (%s, "
                    "now %s; a replica's clock runs ahead?): using %s instead",
                    entry.name,
                    last_run_at.isoformat(),
                    now.isoformat(),
                    repaired.isoformat(),
                )
                self.set_run_state(entry, repaired, total_run_count)
            return
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
        now: datetime | None = None  # one reading of the clock for the whole pass
        while heap and len(due) < BATCH:
            event = heap[0]
            entry = event[2]
            if event[0] > self._when(entry, 0):
                break
            heapq.heappop(heap)
            self._adopt(entry)
            now = now or entry.default_now()
            wait = _until_due(entry, now)
            if wait is not None and wait > 0:
                # Entries of one slot are judged against the same instant, so the
                # clock passing their due time mid-pass cannot split their batch.
                later.append(event_t(self._when(entry, wait), event[1], entry))
                continue
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
        plans = [
            self._plan(event, entry, next_time, tenure.epoch) for event, entry, next_time in due
        ]
        with _stop_signals_deferred():
            self._claim_and_send(plans, tenure)

    def _claim_and_send(self, plans: list[_Plan], tenure: Tenure) -> None:
        lease = self.lease
        heap = self._heap
        assert heap is not None
        try:
            with lease.observe("claim"):
                won = lease.backend.claim(lease.election, tenure, [p.claim for p in plans])
        except StoreUnavailable as exc:
            logger.warning("celery-leader: claims failed, nothing sent: %s", exc)
            won = [False] * len(plans)
        lost_any = False
        claimed = []
        for plan, ok in zip(plans, won, strict=True):
            heapq.heappush(
                heap,
                event_t(
                    self._when(plan.next_entry, plan.next_time), plan.event[1], plan.next_entry
                ),
            )
            if not ok:
                lost_any = True
                what = ", ".join(plan.slots) or f"the state of {plan.entry.name!r}"
                logger.warning("celery-leader: slot %s not claimed; not sending it", what)
                metrics.count("claims_lost", lease.election)
                continue
            self._shared[plan.claim.entry] = plan.claim.new
            claimed.append(plan)
        failure = self._send_all(claimed, tenure.epoch)
        if failure is not None:
            lost_any |= self._publish_failed(claimed, failure)
        if lost_any:
            # Someone else moved the state (or our term ended): reload it
            # before dispatching anything more.
            self._led_epoch = None

    def _plan(self, event: Any, entry: ScheduleEntry, next_time: float, epoch: int) -> _Plan:
        """Which slots of a due entry to send, by its missed-slot policy, and the claim."""
        lease = self.lease
        policy, grace = self._policy(entry)
        now = entry.default_now()
        previous = (entry.last_run_at, entry.total_run_count)
        dues, total, done_at = _due_slots(entry, now, MAX_MISSED + 1 if policy == "all" else 2)
        promoted = self._promoted_at
        on_time = (
            dues[-1]
            if promoted is None or _aware(entry, dues[-1]) >= _aware(entry, promoted)
            else None
        )
        missed = dues[:-1] if on_time is not None else dues
        if grace is not None:
            horizon = _aware(entry, now) - timedelta(seconds=grace)
            missed = [due for due in missed if _aware(entry, due) >= horizon]
        if policy == "skip":
            catch_up: list[datetime] = []
        elif policy == "once":
            catch_up = missed[-1:] if on_time is None else []
        else:
            catch_up = missed[-MAX_MISSED:]
        send = catch_up + ([on_time] if on_time is not None else [])
        slots = [slot_name(entry.name, due) for due in send]
        dropped = total - len(send)
        if dropped:
            logger.info(
                "celery-leader: not sending %d missed slot(s) of %r, the last due %s "
                "(leader_missed_slots %s%s)",
                dropped,
                entry.name,
                dues[-1].isoformat(timespec="milliseconds"),
                policy,
                "" if grace is None else f", grace {grace:g} s",
            )
            metrics.count("missed_slots_dropped", lease.election, dropped)
        next_entry = self.reserve(entry)
        last_run_at = next_entry.last_run_at if done_at is None else done_at
        self.set_run_state(next_entry, last_run_at, previous[1] + len(send))
        if done_at is not None:
            # On the slot grid: entries that share a period stay due together,
            # so their claims keep going in one round trip.
            next_time = max(0.0, (_due_time(next_entry) - _aware(entry, now)).total_seconds())
        new = _dump_state(next_entry, epoch, lease.instance_id, slots[-1] if slots else None)
        claim = Claim(entry.name, self._shared.get(entry.name), new)
        return _Plan(event, entry, next_entry, slots, send, previous, claim, next_time)

    def _policy(self, entry: ScheduleEntry) -> tuple[str, float | None]:
        """The missed-slot policy and grace of ``entry``: its options, else the settings."""
        config = self.leader_config
        options = entry.options or {}
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
        except ConfigError as exc:
            if entry.name not in self._bad_options:
                self._bad_options.add(entry.name)
                logger.error("celery-leader: %s; using the settings instead", exc)
            return config.missed_slots, config.missed_slots_grace
        return policy, grace

    def _send_all(self, plans: list[_Plan], epoch: int) -> tuple[str, BaseException, bool] | None:
        """Publish every claimed slot; stop at the first failure: ``(slot, error, definite)``."""
        election = self.lease.election
        for plan in plans:
            for slot in plan.slots:
                error, definite = self._send(plan.next_entry, slot, epoch)
                if error is None:
                    plan.sent.append(slot)
                    self._failed_publishes = 0
                    metrics.count("slots_sent", election)
                    continue
                if not definite:
                    plan.sent.append(slot)  # it may be in the broker: it stays claimed
                return slot, error, definite
        return None

    def _publish_failed(self, plans: list[_Plan], failure: tuple[str, BaseException, bool]) -> bool:
        """Hand back what was claimed and not sent; resign after too many failures in a row.

        Returns True when the local state no longer matches the store.
        """
        lease = self.lease
        config = self.leader_config
        slot, error, definite = failure
        self._failed_publishes += 1
        metrics.count("publish_failures", lease.election)
        if definite:
            logger.error(
                "celery-leader: could not send slot %s: nothing reached the broker (%s)",
                slot,
                error,
            )
        else:
            logger.error(
                "celery-leader: could not send slot %s and the broker may have it (%s): "
                "it stays claimed and is not sent again",
                slot,
                error,
                exc_info=error,
            )
        out_of_sync = self._hand_back(plans)
        if self._failed_publishes >= config.max_publish_failures:
            logger.warning(
                "celery-leader: %d publishes failed in a row (the last: slot %s): resigning "
                "the lead of %r for %g s so that a replica that reaches the broker takes over",
                self._failed_publishes,
                slot,
                lease.election,
                lease.ttl,
            )
            lease.step_down(
                f"{self._failed_publishes} publishes failed in a row",
                kind="publish_failures",
                sit_out=lease.ttl,
            )
            self._failed_publishes = 0
        # Rebuilt at the next tick: a slot handed back is due again at once.
        self._heap = None
        return out_of_sync

    def _hand_back(self, plans: list[_Plan]) -> bool:
        """Undo the claims of slots that were not sent, in one fenced compare-and-set.

        The stored state goes back to the last slot sent (or to what it was
        before the claim), so that the next leader, or this one at its next
        tick, sends the rest. Returns True when that failed.
        """
        lease = self.lease
        tenure = lease.tenure
        backs: list[tuple[_Plan, list[str], Claim]] = []
        for plan in plans:
            unsent = plan.slots[len(plan.sent) :]
            if not unsent:
                continue
            last_run_at, count = plan.previous
            if plan.sent:
                last_run_at = plan.dues[len(plan.sent) - 1]
            if last_run_at is None:  # never for an entry whose state was loaded
                last_run_at = _anchor(plan.entry)
            self.set_run_state(plan.next_entry, last_run_at, count + len(plan.sent))
            new = _dump_state(
                plan.next_entry,
                tenure.epoch if tenure is not None else 0,
                lease.instance_id,
                plan.sent[-1] if plan.sent else None,
            )
            backs.append((plan, unsent, Claim(plan.entry.name, plan.claim.new, new)))
        if not backs:
            return False
        won = [False] * len(backs)
        reason = "the term ended"
        if tenure is not None:
            try:
                with lease.observe("claim"):
                    won = lease.backend.claim(lease.election, tenure, [b[2] for b in backs])
            except StoreUnavailable as exc:
                reason = str(exc)
        for (_, unsent, claim), ok in zip(backs, won, strict=True):
            if ok:
                self._shared[claim.entry] = claim.new
                logger.warning(
                    "celery-leader: handed back unsent slot(s) %s: the next leader sends them",
                    ", ".join(unsent),
                )
                metrics.count("slots_handed_back", lease.election, len(unsent))
            else:
                logger.error(
                    "celery-leader: slot(s) %s lost: claimed, not sent, and handing them back "
                    "failed (%s)",
                    ", ".join(unsent),
                    reason,
                )
                metrics.count("slots_lost", lease.election, len(unsent))
        return not all(won)

    def _send(
        self, entry: ScheduleEntry, slot: str, epoch: int
    ) -> tuple[BaseException | None, bool]:
        """Publish one slot through ``apply_entry``: ``(error or None, definitely unsent)``."""
        # INFO: Celery's own "Sending due task" line names no slot or epoch, and
        # this one is what an audit of "who sent which slot" reads.
        logger.info("celery-leader: sending slot %s (epoch %d)", slot, epoch)
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
        kept = {k: v for k, v in options.items() if k not in ENTRY_OPTIONS}
        entry.options = {**kept, "headers": headers}
        self._send_error = None
        self._sending = True
        try:
            # apply_entry (not apply_async): code that hooks it, like
            # sentry-sdk's Crons integration, sees every slot.
            self.apply_entry(entry, producer=producer)
        except Exception as exc:  # a hook of apply_entry raised before sending
            self._send_error = exc
        finally:
            self._sending = False
            entry.options = options
        error = self._send_error
        return error, error is not None and publisher.definitely_unsent(error)

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
        grace = config.missed_slots_grace
        policy = config.missed_slots + ("" if grace is None else f", grace {grace:g} s")
        lines.append(
            f"    . leader store -> {config.display_url}\n"
            f"    . leader election -> {config.beat_election} (ttl {config.ttl:g} s, "
            f"renew every {config.renew_interval:g} s, instance {config.instance_id})\n"
            f"    . leader tick timeout -> {config.watchdog_timeout:g} s, missed slots -> "
            f"{policy}"
        )
        return "\n".join(lines)


class LeaderScheduler(LeaderSchedulerMixin, Scheduler):  # type: ignore[misc]
    """Celery's in-memory scheduler, gated on the beat election.

    Schedule state lives in the lease store, so unlike ``PersistentScheduler``
    no local shelve file is written (replicas on one host would fight over
    it) and a new leader continues where the old one stopped.
    """


def _aware(entry: ScheduleEntry, moment: datetime) -> datetime:
    """``moment`` with a time zone, as the entry's schedule compares times."""
    return entry.schedule.maybe_make_aware(moment)  # type: ignore[no-any-return]


def _on_grid(entry: ScheduleEntry) -> bool:
    """Whether ``entry`` runs at fixed intervals (a slot grid of its period)."""
    sched = entry.schedule
    return (
        isinstance(sched, schedule)
        and not isinstance(sched, crontab)
        and not sched.relative
        and sched.run_every.total_seconds() > 0
    )


def _until_due(entry: ScheduleEntry, now: datetime) -> float | None:
    """Seconds from ``now`` to the next slot of an interval entry; ``None`` when
    ``is_due`` alone can tell (other schedules, or an ``is_due`` of its own)."""
    sched = entry.schedule
    if not _on_grid(entry) or type(sched).is_due is not schedule.is_due or not entry.last_run_at:
        return None
    return (_aware(entry, entry.last_run_at) + sched.run_every - _aware(entry, now)).total_seconds()  # type: ignore[no-any-return]


def _anchor(entry: ScheduleEntry) -> datetime:
    """Where an entry with no stored state starts: now, or for an interval entry,
    the latest multiple of its period since the Unix epoch.

    Interval entries that share a period then share their slots (a batch of
    them stays one claim round trip), on every replica and after restarts.
    """
    now = entry.default_now()
    if not _on_grid(entry):
        return now  # type: ignore[no-any-return]
    aware = _aware(entry, now)
    period = entry.schedule.run_every // _MICROSECOND
    since_epoch = (aware - datetime(1970, 1, 1, tzinfo=aware.tzinfo)) // _MICROSECOND
    return aware - timedelta(microseconds=since_epoch % period)


_MICROSECOND = timedelta(microseconds=1)


def _cron_slots(sched: crontab, begin: datetime, end: datetime) -> list[datetime]:
    """Due times of ``sched`` after ``begin`` up to ``end`` (at most ``_MAX_CRON_STEPS``)."""
    found: list[datetime] = []
    moment = begin
    for _ in range(_MAX_CRON_STEPS):
        start, ends_in, _now = sched.remaining_delta(moment)
        due: datetime = start + ends_in
        if due > end:
            break
        found.append(due)
        moment = due
    return found


def _due_slots(
    entry: ScheduleEntry, now: datetime, need: int = 1
) -> tuple[list[datetime], int, datetime | None]:
    """Due times of the slots of ``entry`` that fell due by ``now``, oldest first.

    Returns ``(due times, how many fell due, last_run_at that records them all)``;
    only the newest ``MAX_MISSED + 1`` due times are listed, and at least the
    newest ``need`` when that many fell due. For schedules
    without a computable series (solar, relative, custom) the one slot that
    ``is_due`` reported, and ``None``: Celery's own ``last_run_at`` (now) applies.
    """
    sched = entry.schedule
    last = entry.last_run_at
    if _on_grid(entry):
        start = _aware(entry, last)
        count = max(1, (_aware(entry, now) - start) // sched.run_every)
        first = max(1, count - MAX_MISSED)
        dues = [start + i * sched.run_every for i in range(first, count + 1)]
        return dues, count, dues[-1]
    if isinstance(sched, crontab):
        # Walk the crontab back from now over a growing window until it holds
        # the ``need`` newest slots (or reaches last_run_at): an entry years
        # behind is not walked minute by minute. ``count`` is then a lower bound.
        start, end = _aware(entry, last), _aware(entry, now)
        window = timedelta(hours=1)
        while True:
            begin = max(start, end - window)
            found = _cron_slots(sched, begin, end)
            if begin == start or len(found) >= need:
                break
            window *= 24
        if found:
            return found[-(MAX_MISSED + 1) :], len(found), found[-1]
    return [_due_time(entry)], 1, None


#: Signals whose Celery handlers stop beat by raising ``SystemExit`` wherever the
#: main thread is. Raised between a slot's claim and its publish, that would lose
#: the claimed slot, so they are held back until the batch is sent; a publish
#: gives up within the broker's retry policy (about a second), which bounds how
#: long a stop waits. SIGKILL is never held back.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


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

    def hold(signum: int, _frame: object) -> None:
        arrived.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            # None: a handler installed outside Python, which cannot be put back.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)


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
    """The shared state of ``entry`` as stored (:func:`celery_leader.schedule.state.dump_state`)."""
    return dump_state(entry.last_run_at, entry.total_run_count, epoch, by, slot)
