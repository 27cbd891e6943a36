"""One slot protocol, two schedulers: the same cases on Celery beat and the Dramatiq scheduler.

Each case drives a scheduler tick by tick on a wall clock the test sets
(``celery_leader.schedule.protocol.utcnow``), against the in-process memory store
and each framework's in-memory broker, and asserts on what was published and
stored. Leases run on real (monotonic) time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import dramatiq
import pytest
from celery import Celery
from celery.beat import Scheduler
from dramatiq.brokers.stub import StubBroker

from celery_leader.backends import Fence, Write, open_store
from celery_leader.backends.memory import MemoryEntries
from celery_leader.celery.beat import LeaderScheduler
from celery_leader.dramatiq import LeaderMiddleware, every
from celery_leader.dramatiq.scheduler import INTERVAL, DramatiqScheduler
from celery_leader.election.lease import Lease
from celery_leader.ledger import marks
from celery_leader.ledger.records import SINCE, WORKERS
from celery_leader.probes.health import check
from celery_leader.schedule import feed as feed_module
from celery_leader.schedule import protocol
from celery_leader.schedule.book import EntryBook
from celery_leader.schedule.feed import POLL_INTERVAL
from celery_leader.schedule.jobs import Job
from celery_leader.schedule.resend import Resender
from celery_leader.schedule.run_desk import CLAIMS
from celery_leader.schedule.run_request import (
    REQUEST_TTL,
    RunRequest,
    new_request,
    request_key,
    run_slot,
    submit,
)
from celery_leader.schedule.state import dump_state, slot_name
from celery_leader.settings.config import LeaderConfig
from harness.waiting import wait_for

ELECTION = "beat"
PERIOD = 10.0
#: Slot 0 of every entry's 10 s grid.
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


class Clock:
    """The schedulers' wall clock; the test moves it."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def slot(name: str, n: float) -> str:
    """Name of slot ``n`` of entry ``name`` (``n`` periods after T0)."""
    due = T0 + n * timedelta(seconds=PERIOD)
    return f"{name}@{due.isoformat(timespec='milliseconds')}"


def state(n: float, count: int = 1) -> str:
    return dump_state(T0 + n * timedelta(seconds=PERIOD), count, 0, "seed")


class Kind(ABC):
    """One scheduler kind: how to build an instance and see what it sent."""

    logger: str
    #: The longest sleep a leader's tick asks for (the Dramatiq loop polls).
    max_sleep: float

    def __init__(self, store: str, settings: dict[str, Any]) -> None:
        self.store = store
        self.settings = settings
        self.config = LeaderConfig.from_mapping(
            {"leader_url": store, "leader_ttl": 0.6, "leader_renew_interval": 0.1, **settings}
        )
        self.failing: type[BaseException] | None = None  # publishes raise this
        self.on_publish: Callable[[], None] | None = None  # called before each publish

    @abstractmethod
    def scheduler(self, entries: dict[str, dict[str, Any]], instance_id: str | None = None) -> Any:
        """A scheduler with ``entries`` (name -> options: policy, grace).

        Another ``instance_id`` makes it another replica: one process holds one
        lease per election and settings, shared by schedulers built alike.
        """

    @abstractmethod
    def tick(self, scheduler: Any) -> float: ...

    @abstractmethod
    def lease(self, scheduler: Any) -> Lease: ...

    @abstractmethod
    def close(self, scheduler: Any) -> None: ...

    @abstractmethod
    def sent(self) -> list[str]:
        """Slot names published since the last call, in order."""

    @abstractmethod
    def stop_mid_publish(self, scheduler: Any) -> None:
        """Run the scheduler as its process would and stop it while it publishes."""

    def publishing(self) -> None:
        if self.on_publish is not None:
            self.on_publish()
        if self.failing is not None:
            raise self.failing("injected by the test")

    def stored(self) -> dict[str, dict[str, Any]]:
        backend = open_store(self.config)
        return {k: json.loads(v) for k, v in backend.records.load(ELECTION).items()}

    def seed(self, states: dict[str, str]) -> None:
        """Write state as a previous leader would: a fenced claim under its own term."""
        backend = open_store(self.config)
        term = backend.lock.acquire(ELECTION, "previous-leader", self.config.ttl, 0).term
        assert term is not None, "seed before any scheduler leads"
        stored = backend.records.load(ELECTION)
        claims = [Write(name, stored.get(name), raw) for name, raw in states.items()]
        assert all(backend.records.claim(Fence(ELECTION, term), claims))
        backend.lock.release(ELECTION, term)


class CeleryKind(Kind):
    logger = "celery_leader.celery.beat"
    max_sleep = POLL_INTERVAL  # a leader asks this often whether store entries changed

    def __init__(self, store: str, settings: dict[str, Any], monkeypatch: Any) -> None:
        super().__init__(store, settings)
        self.app = Celery("contract", broker="memory://", set_as_current=False)
        self.app.conf.task_default_queue = f"q-{uuid.uuid4().hex}"
        self.app.conf.leader_url = store
        self.app.conf.leader_ttl = 0.6
        self.app.conf.leader_renew_interval = 0.1
        for key, value in settings.items():
            self.app.conf[key] = value
        original = Scheduler.apply_async

        def apply_async(scheduler: Any, *args: Any, **kwargs: Any) -> Any:
            self.publishing()
            return original(scheduler, *args, **kwargs)

        monkeypatch.setattr(Scheduler, "apply_async", apply_async)

    def scheduler(self, entries: dict[str, dict[str, Any]], instance_id: str | None = None) -> Any:
        self.app.conf.leader_instance_id = instance_id or self.settings.get("leader_instance_id")
        self.app.conf.beat_schedule = {
            name: {
                "task": "t.noop",
                "schedule": PERIOD,
                "options": {f"leader_{k}": v for k, v in options.items()},
            }
            for name, options in entries.items()
        }
        return LeaderScheduler(app=self.app)

    def tick(self, scheduler: Any) -> float:
        return float(scheduler.tick())

    def lease(self, scheduler: Any) -> Lease:
        return scheduler.lease  # type: ignore[no-any-return]

    def close(self, scheduler: Any) -> None:
        scheduler.close()

    def sent(self) -> list[str]:
        out = []
        with self.app.connection_for_read() as conn:
            queue = conn.SimpleQueue(self.app.conf.task_default_queue)
            try:
                while True:
                    try:
                        message = queue.get(timeout=0.01)
                    except queue.Empty:
                        return out
                    out.append(message.headers["leader_slot"])
                    message.ack()
            finally:
                queue.close()

    def stop_mid_publish(self, scheduler: Any) -> None:
        # Celery beat stops by raising SystemExit from its SIGTERM handler.
        def stop(signum: int, frame: object) -> None:
            raise SystemExit(143)

        self.on_publish = lambda: os.kill(os.getpid(), signal.SIGTERM)
        previous = signal.signal(signal.SIGTERM, stop)
        try:
            with pytest.raises(SystemExit):
                while True:
                    self.tick(scheduler)
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.on_publish = None


class DramatiqKind(Kind):
    logger = "celery_leader.dramatiq.scheduler"
    max_sleep = INTERVAL

    def __init__(self, store: str, settings: dict[str, Any], monkeypatch: Any) -> None:
        super().__init__(store, settings)
        for key, value in settings.items():
            if value is not None:
                monkeypatch.setenv(f"CELERY_{key.upper()}", str(value))
        self.broker = StubBroker()
        self.middleware = LeaderMiddleware(url=store, ttl=0.6, renew_interval=0.1)
        self.broker.add_middleware(self.middleware)
        dramatiq.set_broker(self.broker)
        original = self.broker.enqueue

        def enqueue(message: Any, **kwargs: Any) -> Any:
            self.publishing()
            return original(message, **kwargs)

        monkeypatch.setattr(self.broker, "enqueue", enqueue)
        self._seen = 0

    def scheduler(self, entries: dict[str, dict[str, Any]], instance_id: str | None = None) -> Any:
        for name, options in entries.items():
            if f"a_{name}" not in self.broker.actors:
                schedule = every(
                    PERIOD,
                    name=name,
                    missed_slots=options.get("missed_slots"),
                    missed_slots_grace=options.get("missed_slots_grace"),
                )
                dramatiq.actor(actor_name=f"a_{name}", queue_name="ticks",
                               leader_schedule=schedule)(lambda: None)  # fmt: skip
        config = self.middleware.process_config()
        if instance_id is not None:
            config = dataclasses.replace(config, instance_id=instance_id)
        return DramatiqScheduler(self.broker, config)

    def tick(self, scheduler: Any) -> float:
        # As the scheduler's loop does: the store's entries are followed first.
        return float(scheduler.tick())

    def lease(self, scheduler: Any) -> Lease:
        return scheduler.protocol.lease  # type: ignore[no-any-return]

    def close(self, scheduler: Any) -> None:
        scheduler.protocol.close()

    def sent(self) -> list[str]:
        queue = self.broker.queues.get("ticks")
        if queue is None:
            return []
        messages = [dramatiq.Message.decode(m) for m in list(queue.queue)]
        new = messages[self._seen :]
        self._seen = len(messages)
        return [m.options["leader_slot"] for m in new]

    def stop_mid_publish(self, scheduler: Any) -> None:
        # The runner's signal handlers only set this event.
        stop = threading.Event()
        self.on_publish = stop.set
        try:
            scheduler.run(stop)
        finally:
            self.on_publish = None


KINDS = {"celery": CeleryKind, "dramatiq": DramatiqKind}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    made = Clock(T0 + timedelta(seconds=0.3 * PERIOD))
    monkeypatch.setattr(protocol, "utcnow", made)
    return made


@pytest.fixture(params=sorted(KINDS))
def make(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Kind]]:
    """``make(**settings)``: the scheduler kind under test, on a fresh memory store."""
    built: list[tuple[Kind, list[Any]]] = []
    store = f"memory://contract-{uuid.uuid4().hex}"

    def build(**settings: Any) -> Kind:
        kind = KINDS[request.param](store, settings, monkeypatch)
        built.append((kind, []))
        return kind

    yield build
    for kind, _ in built:
        if isinstance(kind, DramatiqKind):
            kind.middleware.campaign.stop()
            kind.broker.close()


@pytest.fixture
def running(make: Callable[..., Kind]) -> Iterator[Callable[..., tuple[Kind, Any]]]:
    """``running(entries, **settings)``: a scheduler that leads; closed at teardown."""
    made: list[tuple[Kind, Any]] = []

    def start(entries: dict[str, dict[str, Any]], seed: dict[str, str] | None = None,
              **settings: Any) -> tuple[Kind, Any]:  # fmt: skip
        kind = make(**settings)
        if seed:
            kind.seed(seed)
        scheduler = kind.scheduler(entries)
        wait_for(kind.lease(scheduler).is_leader, 3, message="the scheduler never led")
        made.append((kind, scheduler))
        return kind, scheduler

    yield start
    for kind, scheduler in made:
        kind.close(scheduler)


# -- the cases ----------------------------------------------------------------------


def test_an_entry_without_state_is_anchored_before_anything_is_sent(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    kind, scheduler = running({"a": {}, "b": {}})
    wait = kind.tick(scheduler)
    assert kind.sent() == []
    assert wait == pytest.approx(min(0.7 * PERIOD, kind.max_sleep))
    stored = kind.stored()
    assert {k: v["last_run_at"] for k, v in stored.items()} == dict.fromkeys("ab", T0.isoformat())
    clock.advance(0.7 * PERIOD)
    assert kind.tick(scheduler) == 0.0
    assert sorted(kind.sent()) == [slot("a", 1), slot("b", 1)]
    assert kind.tick(scheduler) == pytest.approx(min(PERIOD, kind.max_sleep))


@pytest.mark.parametrize(
    ("policy", "grace", "expected"),
    [
        ("once", None, [3]),
        ("skip", None, []),
        ("all", None, [1, 2, 3]),
        ("all", 25, [2, 3]),
        ("once", 5, []),
    ],
)
def test_missed_slots_follow_the_policy(
    running: Callable[..., tuple[Kind, Any]],
    clock: Clock,
    policy: str,
    grace: float | None,
    expected: list[int],
) -> None:
    # Slot 0 was the last sent; the clock reads 3.6 periods later: 1, 2, 3 were missed.
    clock.now = T0 + 3.6 * timedelta(seconds=PERIOD)
    kind, scheduler = running(
        {"e": {}}, seed={"e": state(0, 5)},
        leader_missed_slots=policy, leader_missed_slots_grace=grace,
    )  # fmt: skip
    assert kind.tick(scheduler) == 0.0
    assert kind.sent() == [slot("e", n) for n in expected]
    after = kind.stored()["e"]
    assert after["last_run_at"] == (T0 + 3 * timedelta(seconds=PERIOD)).isoformat()
    assert after["total_run_count"] == 5 + len(expected)
    assert kind.tick(scheduler) == pytest.approx(min(0.4 * PERIOD, kind.max_sleep))


def test_an_entry_option_overrides_the_missed_slots_setting(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    clock.now = T0 + 3.6 * timedelta(seconds=PERIOD)
    kind, scheduler = running(
        {"skipped": {}, "all": {"missed_slots": "all"}},
        seed={"skipped": state(0), "all": state(0)},
        leader_missed_slots="skip",
    )
    kind.tick(scheduler)
    assert sorted(kind.sent()) == [slot("all", n) for n in (1, 2, 3)]


def test_state_a_day_ahead_is_repaired_with_one_warning_and_the_entry_keeps_firing(
    running: Callable[..., tuple[Kind, Any]], clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    day = 24 * 3600 / PERIOD
    kind, scheduler = running({"e": {}, "ok": {}}, seed={"e": state(day), "ok": state(0)})
    with caplog.at_level(logging.WARNING, logger=kind.logger):
        kind.tick(scheduler)
        clock.advance(PERIOD)
        kind.tick(scheduler)
        clock.advance(PERIOD)
        kind.tick(scheduler)
    assert sorted(kind.sent()) == sorted([slot("e", 1), slot("e", 2), slot("ok", 1),
                                          slot("ok", 2)])  # fmt: skip
    warnings = [r.message for r in caplog.records if "in the future" in r.message]
    assert len(warnings) == 1 and "'e'" in warnings[0], warnings


def test_state_ahead_by_clock_skew_is_waited_for_and_never_replayed(
    running: Callable[..., tuple[Kind, Any]], clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # A replica whose clock ran 10 minutes ahead sent up to slot 60 (T0 + 10 min).
    kind, scheduler = running({"e": {}}, seed={"e": state(60, 60)})
    with caplog.at_level(logging.WARNING, logger=kind.logger):
        for _ in range(59):
            assert kind.tick(scheduler) > 0
            clock.advance(PERIOD)
        assert kind.sent() == []
        clock.now = T0 + timedelta(seconds=61 * PERIOD)
        kind.tick(scheduler)
    assert kind.sent() == [slot("e", 61)]
    waits = [r.message for r in caplog.records if "waits until this clock" in r.message]
    assert len(waits) == 1 and "'e'" in waits[0]


def test_a_definitely_unsent_slot_is_handed_back_and_sent_once_later(
    running: Callable[..., tuple[Kind, Any]], clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    kind, scheduler = running({"e": {}}, seed={"e": state(0, 3)})
    before = kind.stored()["e"]
    clock.advance(0.7 * PERIOD)  # slot 1 is due
    kind.failing = ConnectionRefusedError
    kind.tick(scheduler)
    assert kind.sent() == []
    assert "handed back unsent slot(s) " + slot("e", 1) in caplog.text
    after = kind.stored()["e"]
    assert (after["last_run_at"], after["total_run_count"]) == (
        before["last_run_at"],
        before["total_run_count"],
    )
    kind.failing = None
    kind.tick(scheduler)
    kind.tick(scheduler)
    assert kind.sent() == [slot("e", 1)]


def test_a_slot_whose_publish_outcome_is_unknown_stays_claimed(
    running: Callable[..., tuple[Kind, Any]], clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    kind, scheduler = running({"e": {}}, seed={"e": state(0)})
    clock.advance(0.7 * PERIOD)
    kind.failing = ConnectionResetError
    kind.tick(scheduler)
    kind.failing = None
    assert "the broker may have it" in caplog.text
    assert kind.stored()["e"]["slot"] == slot("e", 1)
    kind.tick(scheduler)
    assert kind.sent() == []
    clock.advance(PERIOD)
    kind.tick(scheduler)
    assert kind.sent() == [slot("e", 2)]


def test_the_leader_resigns_after_max_publish_failures_in_a_row(
    running: Callable[..., tuple[Kind, Any]], clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    kind, scheduler = running({"e": {}}, seed={"e": state(0)}, leader_max_publish_failures=2)
    clock.advance(0.7 * PERIOD)
    kind.failing = ConnectionRefusedError
    kind.tick(scheduler)
    assert kind.lease(scheduler).is_leader()
    kind.tick(scheduler)
    assert not kind.lease(scheduler).is_leader()
    assert "2 publishes failed in a row" in caplog.text


def test_a_term_lost_mid_batch_sends_what_it_claimed_and_its_successor_nothing_twice(
    running: Callable[..., tuple[Kind, Any]], make: Callable[..., Kind], clock: Clock
) -> None:
    kind, scheduler = running({"a": {}, "b": {}}, seed={"a": state(0), "b": state(0)})
    clock.advance(0.7 * PERIOD)
    lease = kind.lease(scheduler)
    kind.on_publish = lambda: lease.step_down("the test takes the term away", sit_out=5)
    kind.tick(scheduler)
    kind.on_publish = None
    # Both slots were claimed under the term before it ended: both are sent, once.
    assert sorted(kind.sent()) == [slot("a", 1), slot("b", 1)]
    assert kind.tick(scheduler) < 1  # a follower now
    successor = kind.scheduler({"a": {}, "b": {}}, instance_id="successor")
    try:
        wait_for(kind.lease(successor).is_leader, 3, message="no successor")
        kind.tick(successor)
        assert kind.sent() == []
        clock.advance(PERIOD)
        kind.tick(successor)
        assert sorted(kind.sent()) == [slot("a", 2), slot("b", 2)]
    finally:
        kind.close(successor)


def test_a_stop_during_a_publish_still_sends_the_claimed_slot(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    kind, scheduler = running({"e": {}}, seed={"e": state(0)})
    clock.advance(0.7 * PERIOD)
    kind.stop_mid_publish(scheduler)
    assert kind.sent() == [slot("e", 1)]
    assert kind.stored()["e"]["slot"] == slot("e", 1)


def test_the_health_file_and_the_tick_watchdog_work_the_same(
    running: Callable[..., tuple[Kind, Any]], clock: Clock, tmp_path: Any
) -> None:
    path = tmp_path / "health.json"
    kind, scheduler = running({"e": {}}, leader_health_file=str(path), leader_tick_timeout=0.3)
    clock.now = T0 + 0.99 * timedelta(seconds=PERIOD)  # the next tick is due in 0.1 s
    kind.tick(scheduler)
    wait_for(lambda: path.exists() and json.loads(path.read_text())["role"] == "leader", 2)
    ok, line = check(path)
    assert ok and line.startswith("OK: leader of 'beat'"), line
    # No tick for longer than leader_tick_timeout: the lease hands over, the probe fails.
    lease = kind.lease(scheduler)
    wait_for(lambda: not lease.is_leader(), 3, message="the hung leader kept leading")
    ok, line = check(path)
    assert not ok and "tick is overdue" in line


# -- edits between ticks (what a runtime-edited schedule hands the protocol) ----------


def edit_jobs(scheduler: Any, change: Callable[[list[Job]], list[Job]]) -> None:
    """From now on the protocol sees the scheduler's jobs as ``change`` edits them."""
    slot_protocol = getattr(scheduler, "_protocol", None) or scheduler.protocol
    adapter = slot_protocol.adapter
    own = type(adapter).jobs.__get__(adapter)
    adapter.jobs = lambda: change(list(own()))
    # ``change`` may answer differently at each call: the jobs are listed at every tick,
    # whole (not as the edits the adapter would tell).
    adapter.jobs_changed = lambda: True
    adapter.job_edits = lambda: None


def test_a_re_timed_entry_sends_its_first_new_slot_at_once(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    kind, scheduler = running({"e": {}})
    kind.tick(scheduler)  # anchored at slot 0; the next is slot 1
    clock.now = T0 + timedelta(seconds=0.65 * PERIOD)
    edited = clock.now
    # A Dramatiq schedule is a series too, and the Dramatiq adapter publishes from it.
    edit_jobs(scheduler, lambda jobs: [
        dataclasses.replace(j, series=every(0.1 * PERIOD), active_since=edited) for j in jobs
    ])  # fmt: skip
    assert kind.tick(scheduler) == pytest.approx(min(0.05 * PERIOD, kind.max_sleep))
    clock.now = T0 + timedelta(seconds=0.7 * PERIOD)
    kind.tick(scheduler)
    assert kind.sent() == [slot("e", 0.7)]


def test_an_entry_back_from_a_pause_sends_nothing_from_the_pause(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    kind, scheduler = running({"e": {}}, leader_missed_slots="all")
    kind.tick(scheduler)
    paused = [True]
    resumed = T0 + timedelta(seconds=4.5 * PERIOD)
    edit_jobs(scheduler, lambda jobs: [] if paused[0] else [
        dataclasses.replace(j, active_since=resumed) for j in jobs
    ])  # fmt: skip
    clock.now = resumed
    kind.tick(scheduler)
    paused[0] = False
    kind.tick(scheduler)
    assert kind.sent() == []  # slots 1 ... 4 fell while it was paused
    clock.advance(0.5 * PERIOD)
    kind.tick(scheduler)
    assert kind.sent() == [slot("e", 5)]


def test_an_entry_re_created_under_its_name_starts_fresh(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    clock.now = T0 + 3.6 * timedelta(seconds=PERIOD)
    old = dump_state(T0 - 50 * timedelta(seconds=PERIOD), 9, 0, "seed", generation="old")
    kind, scheduler = running({"e": {}}, seed={"e": old}, leader_missed_slots="all")
    edit_jobs(scheduler, lambda jobs: [dataclasses.replace(j, generation="new") for j in jobs])
    kind.tick(scheduler)
    assert kind.sent() == []
    stored = kind.stored()["e"]
    assert (stored["generation"], stored["total_run_count"]) == ("new", 0)
    clock.advance(0.4 * PERIOD)
    kind.tick(scheduler)
    assert kind.sent() == [slot("e", 4)]


# -- run now ------------------------------------------------------------------------


def ask(kind: Kind, entry: str, key: str, requested_at: float | None = None) -> RunRequest:
    """Write a run-now request as ``leader entries run`` does (no lease)."""
    store = open_store(kind.config)
    try:
        at = time.time() if requested_at is None else requested_at
        request, _ = submit(store.entries, ELECTION, new_request(entry, key, "tester", None, at))
        return request
    finally:
        store.close()


def answer(kind: Kind, request: RunRequest) -> RunRequest:
    """The request as the store holds it now."""
    store = open_store(kind.config)
    try:
        found = RunRequest.load(store.entries.load(ELECTION)[1][request.store_key])
        assert found is not None
        return found
    finally:
        store.close()


def answered(kind: Kind, scheduler: Any, request: RunRequest) -> RunRequest:
    """Tick until the leader answered ``request``."""

    def done() -> RunRequest | None:
        kind.tick(scheduler)
        found = answer(kind, request)
        return found if found.outcome is not None else None

    found: RunRequest = wait_for(done, 5, interval=0.01, message="the leader never answered")
    return found


@pytest.fixture
def polled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader reads the store's entries at every tick (not every half second)."""
    monkeypatch.setattr(feed_module, "POLL_INTERVAL", 0)


@pytest.mark.usefixtures("polled")
def test_a_run_request_is_sent_once_by_the_leader_under_its_term_and_answered(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    kind, scheduler = running({"e": {}})
    kind.tick(scheduler)  # anchored
    request = ask(kind, "e", "k1")
    found = answered(kind, scheduler, request)
    epoch = kind.lease(scheduler).term.epoch
    assert found.outcome is not None
    assert (found.outcome.state, found.outcome.slot, found.outcome.epoch) == (
        "sent",
        run_slot("e", clock.now),
        epoch,
    )
    assert kind.sent() == [run_slot("e", clock.now)]
    # Claimed under the term, in the fenced records.
    assert kind.stored()[CLAIMS] == {
        request.store_key: {"slot": run_slot("e", clock.now), "epoch": epoch}
    }
    # The same key again: the first request's outcome, nothing sent.
    again, repeated = ask_again(kind, "e", "k1")
    assert repeated and again.outcome == found.outcome
    for _ in range(5):
        kind.tick(scheduler)
    assert kind.sent() == []
    # The grid goes on as before: the run-now slot moved nothing of the entry's state.
    assert kind.stored()["e"]["last_run_at"] == T0.isoformat()
    clock.advance(0.7 * PERIOD)
    kind.tick(scheduler)
    assert kind.sent() == [slot("e", 1)]


def ask_again(kind: Kind, entry: str, key: str) -> tuple[RunRequest, bool]:
    store = open_store(kind.config)
    try:
        return submit(store.entries, ELECTION, new_request(entry, key, "tester", None, time.time()))
    finally:
        store.close()


@pytest.mark.usefixtures("polled")
def test_a_run_request_of_no_entry_is_refused_and_one_older_than_its_ttl_is_dropped(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    kind, scheduler = running({"e": {}})
    kind.tick(scheduler)
    unknown = answered(kind, scheduler, ask(kind, "nope", "k"))
    assert unknown.outcome is not None and unknown.outcome.state == "refused"
    assert "no entry nope" in (unknown.outcome.why or "")
    late = answered(kind, scheduler, ask(kind, "e", "k", clock.now.timestamp() - REQUEST_TTL - 1))
    assert late.outcome is not None and late.outcome.state == "expired"
    assert kind.sent() == []


@pytest.mark.usefixtures("polled")
def test_a_paused_store_entry_runs_on_request_with_its_stored_definition(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    kind, scheduler = running({"e": {}})
    store = open_store(kind.config)
    try:
        task = "t.noop" if isinstance(kind, CeleryKind) else "a_e"
        EntryBook(store.entries, ELECTION).add(name="s", task=task, every=3600, enabled=False)
    finally:
        store.close()
    kind.tick(scheduler)
    found = answered(kind, scheduler, ask(kind, "s", "k"))
    assert found.outcome is not None and found.outcome.state == "sent", found.outcome
    assert kind.sent() == [run_slot("s", clock.now)]


@pytest.mark.usefixtures("polled")
def test_a_request_claimed_by_a_leader_that_stopped_is_never_sent_again(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    # A previous leader claimed it under epoch 1, then stopped before publishing or answering.
    key = request_key("e", "k")
    claimed = run_slot("e", clock.now - timedelta(seconds=1))
    kind, scheduler = running(
        {"e": {}}, seed={CLAIMS: json.dumps({key: {"slot": claimed, "epoch": 1}})}
    )
    kind.tick(scheduler)
    found = answered(kind, scheduler, ask(kind, "e", "k"))
    assert found.outcome is not None
    assert (found.outcome.state, found.outcome.slot) == ("unknown", claimed)
    assert kind.sent() == []


@pytest.mark.usefixtures("polled")
def test_with_dedup_workers_a_claimed_unanswered_request_is_re_sent_once(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    """As a grid slot claimed by a leader that died: re-sent once, unless a worker
    recorded it; workers drop a second copy by its slot name."""
    key = request_key("e", "k")
    claimed = run_slot("e", clock.now - timedelta(seconds=1))
    kind, scheduler = running(
        {"e": {}}, seed={CLAIMS: json.dumps({key: {"slot": claimed, "epoch": 1}})}
    )
    store = open_store(kind.config)
    try:
        marks.touch(store.runs, ELECTION, WORKERS, {"workers": 1}, 60)
    finally:
        store.close()
    kind.tick(scheduler)
    found = answered(kind, scheduler, ask(kind, "e", "k"))
    assert found.outcome is not None and found.outcome.state == "unknown"
    assert "re-sends it once" in (found.outcome.why or "")
    for _ in range(3):
        kind.tick(scheduler)
    assert kind.sent() == [claimed], "re-sent once, under this term"


# -- a large schedule of store entries ------------------------------------------------


def add_store_entries(kind: Kind, names: list[str], every: float, clock: Clock) -> None:
    """Store entries ``names``, each sending the kind's task every ``every`` seconds."""
    task = "t.noop" if isinstance(kind, CeleryKind) else "a_e"
    store = open_store(kind.config)
    try:
        book = EntryBook(store.entries, ELECTION, now=clock)
        for name in names:
            book.add(name=name, task=task, every=every)
    finally:
        store.close()


@pytest.mark.usefixtures("polled")
def test_the_due_entry_of_the_first_page_is_sent_before_the_last_page_is_read(
    running: Callable[..., tuple[Kind, Any]], clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large schedule is read page by page: what the first pages hold is sent when due
    while the rest is still coming, each slot once."""
    monkeypatch.setattr(feed_module, "PAGE_SLICE", 0)  # a page per tick
    kind, scheduler = running({"e": {}})
    fillers = [f"f{i:03}" for i in range(200)]
    add_store_entries(kind, ["s"], PERIOD, clock)
    add_store_entries(kind, fillers, 3600, clock)
    read: list[str] = []
    whole = MemoryEntries.load

    def load(self: MemoryEntries, election: str) -> tuple[int, dict[str, str]]:
        read.append("all")
        return whole(self, election)

    def load_pages(self: MemoryEntries, election: str) -> tuple[int, Iterator[dict[str, str]]]:
        version, texts = whole(self, election)
        items = sorted(texts.items(), key=lambda item: item[0] != "s")  # "s" first

        def pages() -> Iterator[dict[str, str]]:
            for first in range(0, len(items), 10):
                read.append(f"page {first // 10}")
                yield dict(items[first : first + 10])

        return version, pages()

    monkeypatch.setattr(MemoryEntries, "load", load)
    monkeypatch.setattr(MemoryEntries, "load_pages", load_pages)
    kind.tick(scheduler)
    kind.tick(scheduler)
    clock.now = T0 + timedelta(seconds=1.05 * PERIOD)
    sent: list[str] = []
    for _ in range(5):
        kind.tick(scheduler)
        sent += kind.sent()
        if slot("s", 1) in sent:
            break
    assert slot("s", 1) in sent, sent
    assert "all" not in read and "page 20" not in read, f"sent after reading {read}"
    for _ in range(40):
        kind.tick(scheduler)
    assert "page 20" in read, "every page read in the end"
    sent += kind.sent()
    assert sorted(sent) == sorted([slot("e", 1), slot("s", 1)]), "each once"


@pytest.mark.usefixtures("polled")
def test_an_edit_of_one_store_entry_touches_only_its_job(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    """An edit costs what it touched: the jobs are not listed again, the other entries'
    jobs and state stay as they were, and the edited entry's takes effect."""
    kind, scheduler = running({"e": {}})
    names = [f"h{i:03}" for i in range(300)]
    add_store_entries(kind, names, 3600, clock)
    slot_protocol = getattr(scheduler, "_protocol", None) or scheduler.protocol
    adapter, held = slot_protocol.adapter, slot_protocol.held
    while not slot_protocol.loaded() or len(held.states) < 301:
        kind.tick(scheduler)
    jobs, states = dict(held.jobs), dict(held.states)
    listed: list[bool] = []
    whole = type(adapter).jobs

    def counted(self: Any) -> Any:
        listed.append(True)
        return whole(self)

    adapter.jobs = counted.__get__(adapter)
    store = open_store(kind.config)
    try:
        EntryBook(store.entries, ELECTION, now=clock).update("h007", every=PERIOD)
    finally:
        store.close()
    kind.tick(scheduler)
    assert held.jobs["h007"].series is not jobs["h007"].series, "the edit was taken in"
    assert listed == [], "the jobs were not listed again"
    assert all(held.jobs[n] is jobs[n] for n in jobs if n != "h007")
    assert all(held.states[n] is states[n] for n in states if n != "h007")
    clock.now = T0 + timedelta(seconds=1.05 * PERIOD)
    kind.tick(scheduler)
    assert sorted(kind.sent()) == sorted([slot("e", 1), slot("h007", 1)])


@pytest.mark.usefixtures("polled")
def test_a_new_terms_recovery_waits_for_the_last_page(
    running: Callable[..., tuple[Kind, Any]], clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run ledger's recovery of a new term looks at every entry: it waits until the
    store's entries are all read, not only until what was read so far is loaded."""
    monkeypatch.setattr(feed_module, "PAGE_SLICE", 0)  # a page per tick
    kind, scheduler = running({"e": {}})
    names = [f"h{i:03}" for i in range(50)]
    add_store_entries(kind, names, 3600, clock)
    recovered: list[set[str]] = []
    monkeypatch.setattr(
        Resender, "recover", lambda self, jobs, states, epoch: recovered.append(
            {job.name for job in jobs}
        ),
    )  # fmt: skip

    def load_pages(self: MemoryEntries, election: str) -> tuple[int, Iterator[dict[str, str]]]:
        version, texts = self.load(election)
        items = list(texts.items())
        return version, (dict(items[i : i + 10]) for i in range(0, len(items), 10))

    monkeypatch.setattr(MemoryEntries, "load_pages", load_pages)
    slot_protocol = getattr(scheduler, "_protocol", None) or scheduler.protocol
    for _ in range(30):
        kind.tick(scheduler)
    assert not slot_protocol.adapter.catalog.loading()
    assert recovered == [{"e", *names}], "once, over every entry"


@pytest.mark.usefixtures("polled")
def test_a_new_term_sends_what_is_due_before_it_re_sends_the_last_terms_slot(
    running: Callable[..., tuple[Kind, Any]], clock: Clock
) -> None:
    """The run ledger's recovery re-sends each entry's last slot claimed before the term,
    if it left no trace (with workers that drop a second copy). Its store calls wait until
    the term has sent what is due, and it still looks at the slot the previous term
    claimed, not at the one this term just sent and marked."""
    # The recovery trusts the ledger only back to when it was started (its "since"
    # mark) and half its retention: a slot a minute ago, on the entry's 10 s grid.
    now = datetime.now(timezone.utc)
    last = datetime.fromtimestamp(now.timestamp() // PERIOD * PERIOD - 60, timezone.utc)
    previous = dump_state(last, 1, 1, "previous-leader", slot_name("e", last))
    kind, scheduler = running({"e": {}}, seed={"e": previous})
    store = open_store(kind.config)
    try:
        marks.touch(store.runs, ELECTION, WORKERS, {"workers": 1}, 60)
        marks.touch(store.runs, ELECTION, SINCE, {"since": now.timestamp() - 3600}, 3600)
    finally:
        store.close()
    clock.now = last + timedelta(seconds=1.05 * PERIOD)
    for _ in range(3):
        kind.tick(scheduler)
    due = last + timedelta(seconds=PERIOD)
    assert kind.sent() == [slot_name("e", due), slot_name("e", last)]
