"""Celery beat on every replica, one dispatcher, no schedule slot sent twice: the
scheduler's side of the slot protocol (set-up, hooks, banner, stop signals)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from ..exceptions import missing_extra
from ..probes import metrics
from ..schedule.feed import POLL_INTERVAL
from ..schedule.jobs import Job
from ..schedule.protocol import SlotProtocol
from . import publishing, startup
from .adapter import BeatAdapter, collector_paused, keep_out_of_collections
from .signals import SIGNALS

try:
    from celery.beat import ScheduleEntry, Scheduler
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
#: core, so that replicas started together leave the CPU to the one elected.
WARM_SLICE = 0.02


class LeaderSchedulerMixin:
    """Put first in the bases of a Celery scheduler to gate it on a lease.

    The lease is created on the first ``tick()``, not in ``__init__``: beat builds
    its scheduler once more just to print the banner.
    """

    # Attributes of the Scheduler this mixes into, for the type checker.
    app: Any
    max_interval: float
    schedule: dict[str, ScheduleEntry]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        app = kwargs.get("app", args[0] if args else None)
        # Validate at start-up (beat builds its scheduler for the banner, before
        # it runs), so bad settings and a store that cannot be built fail there.
        self.leader_config = startup.app_config(app)
        self._set_up = False
        with collector_paused():
            super().__init__(*args, **kwargs)
            self._adapter = BeatAdapter(self, logger)
            self._protocol = SlotProtocol(
                self.leader_config,
                self._adapter,
                logger,
                idle=FOLLOWER_INTERVAL,
                max_sleep=self.max_interval,
                observers=(SIGNALS, metrics.OBSERVER),
            )
        if self._set_up:
            keep_out_of_collections(len(self.schedule))

    def setup_schedule(self) -> None:
        """Deferred until this instance first leads: some schedulers write shared state
        while setting up (django-celery-beat saves ``beat_schedule``)."""

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
        """One scheduler pass; only a current leader dispatches. Wakes at least every
        ``POLL_INTERVAL`` to see edits of the store's entries; stop signals are held
        back until the pass ends (see ``_STOP_SIGNALS``)."""
        adapter = self._adapter
        with _stop_signals_deferred():
            lease = self.lease
            # Only where the schedule was set up at start-up: a scheduler that writes
            # while setting up waits until it leads. Code entries' jobs are made a
            # slice per tick (see WARM_SLICE).
            adapter.catalog.follow(
                self._protocol.runtime.store.entries,
                lease.term is None,
                adapter,
                lambda: self._set_up and adapter.warm(WARM_SLICE),
            )
            sleep = min(self._protocol.tick(), POLL_INTERVAL)
            return 0.0 if adapter.catalog.loading() and lease.term is not None else sleep

    def leader_jobs(self, store_entries: bool = False) -> Sequence[Job]:
        """The schedule's entries as the slot protocol sees them (``leader plan`` lists them),
        on a scheduler that never ticks; ``store_entries``: also the store's entries."""
        adapter = self._adapter
        return adapter.catalog.read_once(adapter.jobs) if store_entries else adapter.jobs()

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
        """``jobs`` with their ``generation`` and ``active_since`` (a hook: entries edited at
        runtime, such as django-celery-beat's rows). ``edited``: ``jobs`` are only those
        entries listed again; ``None``: ``jobs`` are all of them."""
        return jobs

    def stopped_leading(self) -> None:
        """This replica stopped dispatching (a hook): give back its broker connection
        (reopened on promotion)."""
        self._adapter.publisher.release()
        producer = self.__dict__.pop("producer", None)
        connection = self.__dict__.pop("connection", None)
        held = (connection, getattr(producer, "connection", None))
        for conn in {id(c): c for c in held if c is not None}.values():
            try:
                conn.release()
            except Exception as exc:
                logger.debug("celery-leader: releasing the broker connection failed: %s", exc)

    def apply_async(
        self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Celery's, except that the failure of a slot's publish is kept as its outcome
        (``apply_entry`` logs and swallows it; the leader needs it)."""
        try:
            return super().apply_async(entry, producer, advance, **kwargs)  # type: ignore[misc]
        except Exception as exc:
            if not publishing.keep_failure(producer, exc):
                raise
            return None

    def close(self) -> None:
        """Hand over first, then close the scheduler. Safe to call twice (beat does)."""
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
    """Celery's in-memory scheduler, gated on the beat election (its state lives in the
    lease store: no shelve file, and a new leader continues where the old one stopped)."""

    def setup_schedule(self) -> None:
        """Build beat's entries at start-up, on every replica: it writes nothing shared,
        and at a promotion the build would be hand-over time."""
        self.set_up_as_leader()

    def merge_inplace(self, b: dict[str, Any]) -> None:
        """Celery's, with one clock reading for every new entry's ``last_run_at`` (a
        placeholder for the stored state) and one copy of each entry's fields: Celery's
        took seconds at 300,000 entries."""
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


#: Signals whose Celery handlers stop beat by raising ``SystemExit`` wherever the
#: main thread is, after closing the scheduler there. Raised between a slot's
#: claim and its publish, that would lose the claimed slot; raised inside a store
#: call, closing the store would wait for a lock that call holds. So they are
#: held back until the tick ends: its store calls and publishes each give up
#: within their deadlines, which bounds how long a stop waits, and the same
#: signal again is delivered at once. SIGKILL is never held back.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


@contextmanager
def _stop_signals_deferred() -> Iterator[None]:
    """Record the stop signals that arrive in this block and deliver them after it
    (Python runs signal handlers in the main thread only: only it swaps them)."""
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
