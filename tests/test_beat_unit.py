"""LeaderScheduler in one process: the memory lease store and kombu's memory broker.

Every test gets its own store (a unique ``memory://`` URL) and its own queue, so
messages are read back exactly as a worker would receive them, headers included.
Time is real but short (ttl 0.6 s, renewals every 0.1 s).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from typing import Any

import pytest
from celery import Celery
from celery.beat import ScheduleEntry, Scheduler, Service
from celery.schedules import crontab
from kombu import Producer
from kombu.exceptions import OperationalError

from celery_leader.backends import Fence, Write, open_store
from celery_leader.backends.memory import MemoryEntries, MemoryRecords
from celery_leader.celery import adapter as beat_adapter
from celery_leader.celery import beat
from celery_leader.celery.beat import FOLLOWER_INTERVAL, LeaderScheduler
from celery_leader.election.lease import Lease
from celery_leader.schedule import protocol
from celery_leader.schedule.feed import POLL_INTERVAL, EntryFeed
from celery_leader.schedule.series import Every
from celery_leader.settings.config import LeaderConfig
from harness.servers import RedisServer
from harness.waiting import wait_for

ELECTION = "beat"
SLOT = re.compile(r"^(?P<name>[^@]+)@(?P<due>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00)$")


@pytest.fixture
def app() -> Celery:
    app = Celery("unit", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = f"q-{uuid.uuid4().hex}"
    app.conf.leader_url = f"memory://{uuid.uuid4().hex}"
    app.conf.leader_ttl = 0.6
    app.conf.leader_renew_interval = 0.1
    app.conf.leader_instance_id = "under-test"
    # Tests tick by hand, with pauses: the watchdog is tested on its own.
    app.conf.leader_tick_timeout = 60
    return app


def replica(app: Celery, n: int, **kwargs: Any) -> LeaderScheduler:
    """Replica ``n`` of ``app``'s beat: its own instance id from the second one on."""
    own = app.conf.leader_instance_id
    if n > 1:
        app.conf.leader_instance_id = f"{own}-{n}"
    try:
        return LeaderScheduler(app=app, **kwargs)
    finally:
        app.conf.leader_instance_id = own


@pytest.fixture
def make_scheduler(app: Celery) -> Iterator[Callable[..., LeaderScheduler]]:
    """Builds schedulers of ``app`` and closes them at teardown (which ends their leases).

    Each is another replica: the second and later get an instance id of their own
    (``under-test-2``, ...), since one process holds one lease per election and
    settings.
    """
    built: list[LeaderScheduler] = []

    def make(**kwargs: Any) -> LeaderScheduler:
        scheduler = replica(app, len(built) + 1, **kwargs)
        built.append(scheduler)
        return scheduler

    yield make
    for scheduler in built:
        scheduler.close()


@pytest.fixture
def rival(app: Celery) -> Iterator[Lease]:
    """Another member of the beat election, sharing the scheduler's store."""
    config = LeaderConfig.from_app(app)
    lease = Lease.from_config(ELECTION, config, open_store(config).lock)
    lease.instance_id = "rival"
    yield lease
    lease.stop()


def every(seconds: float, task: str = "t.noop", **extra: Any) -> dict[str, Any]:
    return {"task": task, "schedule": seconds, **extra}


def state(last_run_at: datetime, count: int) -> str:
    return json.dumps({"last_run_at": last_run_at.isoformat(), "total_run_count": count})


def seed_state(app: Celery, states: dict[str, str]) -> None:
    """Write shared state as a previous leader would: with a fenced claim under its own term."""
    config = LeaderConfig.from_app(app)
    store = open_store(config)
    term = store.lock.acquire(ELECTION, "previous-leader", config.ttl, 0).term
    assert term is not None, "the store is held; seed before any scheduler ticks"
    stored = store.records.load(ELECTION)
    claims = [Write(name, stored.get(name), raw) for name, raw in states.items()]
    assert all(store.records.claim(Fence(ELECTION, term), claims))
    store.lock.release(ELECTION, term)


def stored_state(app: Celery) -> dict[str, str]:
    return open_store(LeaderConfig.from_app(app)).records.load(ELECTION)


def holder(app: Celery) -> str | None:
    info = open_store(LeaderConfig.from_app(app)).lock.holder(ELECTION)
    return None if info is None else info.instance_id


def published(app: Celery) -> list[dict[str, Any]]:
    """Headers of every message sent so far (consumed, so each call returns new ones)."""
    out = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(app.conf.task_default_queue)
        try:
            while True:
                try:
                    message = queue.get(timeout=0.01)
                except queue.Empty:
                    return out
                out.append(dict(message.headers))
                message.ack()
        finally:
            queue.close()


def drive(scheduler: Scheduler, until: Callable[[], object], timeout: float = 5.0) -> None:
    """Beat's own loop: tick, then sleep what the tick asked for, until ``until()``.

    Sleeps are capped so the test notices ``until()`` promptly, and floored at zero
    because a tick may ask for a slightly negative interval, as Celery's own does.
    """

    def step() -> object:
        interval = scheduler.tick()
        done = until()
        if not done:
            time.sleep(max(0.0, min(interval, 0.02)))
        return done

    wait_for(step, timeout, interval=0, message="scheduler never got there")


def wait_leading(scheduler: LeaderScheduler) -> None:
    """Join the election (as the first tick would) and wait for the win, without ticking."""
    wait_for(scheduler.lease.is_leader, 3.0, message="the scheduler never led")


def due_of(slot: str) -> datetime:
    match = SLOT.match(slot)
    assert match, f"leader_slot {slot!r} is not '<entry>@<ISO-8601 due time, ms>'"
    return datetime.fromisoformat(match["due"])


def beat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"celery-leader:{ELECTION}"]


class Spy:
    """Counts calls of a method on a class while still running it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> None:
        self.calls: list[tuple[Any, ...]] = []
        original = getattr(owner, name)

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(args)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)


def test_follower_never_touches_shared_state_nor_runs_the_base_tick(
    app: Celery,
    make_scheduler: Callable[..., LeaderScheduler],
    rival: Lease,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app.conf.beat_schedule = {"e": every(0.05)}
    rival.start()
    wait_for(rival.is_leader, 2.0, message="rival never led")
    spies = {
        name: Spy(monkeypatch, owner, name)
        for owner, name in [
            (MemoryRecords, "load"),
            (MemoryRecords, "claim"),
            (Scheduler, "tick"),
            (Scheduler, "populate_heap"),
            (Scheduler, "apply_async"),
        ]
    }
    scheduler = make_scheduler()
    # Long enough for many schedule periods and for the follower's lease thread to
    # have retried the election several times.
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        assert scheduler.tick() == FOLLOWER_INTERVAL
        time.sleep(0.01)
    assert {name: len(spy.calls) for name, spy in spies.items()} == dict.fromkeys(spies, 0)
    assert published(app) == []
    assert stored_state(app) == {}

    # The same spies do see a leader's work, so the zeros above mean something.
    rival.stop()
    sent: list[dict[str, Any]] = []
    drive(scheduler, lambda: sent.extend(published(app)) or sent)
    assert spies["load"].calls
    assert spies["claim"].calls


def test_promotion_reloads_state_and_rebuilds_the_heap(
    app: Celery,
    make_scheduler: Callable[..., LeaderScheduler],
    rival: Lease,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = datetime(2026, 1, 1, 12, 0, 10, tzinfo=timezone.utc)
    monkeypatch.setattr(protocol, "utcnow", lambda: now)
    app.conf.beat_schedule = {"e": every(30)}
    scheduler = make_scheduler()
    wait_leading(scheduler)
    # Leading with a heap that says "e is due in 30 s".
    assert scheduler.tick() == POLL_INTERVAL  # nothing due: only the entries poll wakes it
    first_epoch = scheduler.lease.epoch

    # Another instance takes over and records a run of "e" a minute ago: "e" is overdue.
    store = open_store(LeaderConfig.from_app(app))
    rival.start()
    store.lock.request_resign(ELECTION)
    wait_for(rival.is_leader, 3.0, message="rival never took over")
    assert scheduler.tick() == FOLLOWER_INTERVAL
    ran_at = now - timedelta(seconds=60)
    fence = rival.fence()
    assert fence is not None
    current = store.records.load(ELECTION).get("e")
    assert store.records.claim(fence, [Write("e", current, state(ran_at, 41))]) == [True]
    rival.stop()

    # Back in office, the scheduler must send "e" at once: the stored state says two
    # slots are overdue (leader_missed_slots "once": the latest of them goes out), and its
    # old plan (due in 30 s) must not be what it follows.
    wait_leading(scheduler)
    assert scheduler.tick() == 0.0
    [headers] = published(app)
    assert headers["leader_epoch"] == scheduler.lease.epoch > (first_epoch or 0)
    # The newest slot of the entry's grid (multiples of 30 s since the Unix epoch).
    assert due_of(headers["leader_slot"]) == datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    after = json.loads(stored_state(app)["e"])
    assert after["total_run_count"] == 42
    assert scheduler.schedule["e"].total_run_count == 42


def test_lazy_schedulers_do_not_join_and_close_is_idempotent(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler]
) -> None:
    app.conf.beat_schedule = {"e": every(0.1)}
    # What `celery beat` does: one lazy scheduler for the banner, then the real one.
    service = Service(app, scheduler_cls=LeaderScheduler)
    banner = service.get_scheduler(lazy=True)
    assert "leader election -> beat" in banner.info
    again = service.get_scheduler(lazy=True)
    real = service.scheduler
    assert beat_threads() == []
    assert holder(app) is None
    for scheduler in (banner, again, banner, again):
        scheduler.close()
    assert beat_threads() == []
    assert holder(app) is None

    wait_leading(real)
    assert holder(app) == "under-test"
    real.close()
    # Handed over at once, not left to expire.
    assert holder(app) is None
    assert beat_threads() == []
    real.close()

    # A new scheduler after all that leads normally.
    fresh = make_scheduler()
    wait_leading(fresh)
    drive(fresh, lambda: published(app))


class FailsForBadTask(Producer):  # type: ignore[misc]
    """A producer whose broker refuses one task, as with an oversize or unroutable message."""

    attempts: list[str]

    def publish(self, body: Any, *args: Any, **kwargs: Any) -> Any:
        headers = kwargs.get("headers") or {}
        if headers.get("task") == "t.bad":
            FailsForBadTask.attempts.append(headers["leader_slot"])
            raise ConnectionError("broker refused t.bad")
        return super().publish(body, *args, **kwargs)


def test_a_failed_publish_does_not_stop_others_and_the_entry_runs_at_its_next_slot(
    app: Celery,
    make_scheduler: Callable[..., LeaderScheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    app.conf.beat_schedule = {
        "good1": every(0.2),
        "bad": every(0.2, task="t.bad"),
        "good2": every(0.2),
    }
    FailsForBadTask.attempts = []
    scheduler = make_scheduler(Producer=FailsForBadTask)
    sent: list[dict[str, Any]] = []

    def enough() -> bool:
        sent.extend(published(app))
        return len(FailsForBadTask.attempts) >= 3 and len(sent) >= 6

    drive(scheduler, enough)
    slots = [h["leader_slot"] for h in sent]
    assert {s.split("@")[0] for s in slots} == {"good1", "good2"}
    assert len(slots) == len(set(slots))
    # Each failed slot was tried once and stays claimed; the next attempt is the next slot.
    attempts = FailsForBadTask.attempts
    assert len(attempts) == len(set(attempts))
    dues = [due_of(s) for s in attempts]
    assert all(b - a >= timedelta(seconds=0.19) for a, b in pairwise(dues))
    assert json.loads(stored_state(app)["bad"])["total_run_count"] >= 3
    assert f"could not send slot {attempts[0]}" in caplog.text


@pytest.mark.parametrize(
    "raw",
    [
        "not json {",
        '{"foreign": true}',
        '["a", "list"]',
        "null",
        '"a string"',
        '{"last_run_at": "yesterday", "total_run_count": 1}',
        '{"last_run_at": 5, "total_run_count": 1}',
        '{"last_run_at": "2024-01-01T00:00:00+00:00", "total_run_count": "7"}',
    ],
)
def test_unreadable_state_is_logged_and_overwritten(
    app: Celery,
    make_scheduler: Callable[..., LeaderScheduler],
    caplog: pytest.LogCaptureFixture,
    raw: str,
) -> None:
    app.conf.beat_schedule = {"e": every(0.1), "ok": every(0.1)}
    seed_state(app, {"e": raw})
    scheduler = make_scheduler()

    def rewritten() -> bool:
        try:
            data = json.loads(stored_state(app)["e"])
        except ValueError:
            return False
        return isinstance(data, dict) and "slot" in data  # a run recorded over it

    with caplog.at_level(logging.ERROR, logger="celery_leader"):
        drive(scheduler, rewritten)
    assert "unreadable schedule state of 'e'" in caplog.text
    fixed = json.loads(stored_state(app)["e"])
    datetime.fromisoformat(fixed["last_run_at"])
    assert isinstance(fixed["total_run_count"], int)
    assert {h["leader_slot"].split("@")[0] for h in published(app)} >= {"e"}


def test_every_message_carries_epoch_and_slot_headers(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler]
) -> None:
    app.conf.beat_schedule = {
        "plain": every(0.1),
        "with-headers": every(0.1, options={"headers": {"mine": "kept"}}),
    }
    scheduler = make_scheduler()
    sent: list[dict[str, Any]] = []

    def two_each() -> bool:
        sent.extend(published(app))
        names = [h["leader_slot"].split("@")[0] for h in sent if "leader_slot" in h]
        return names.count("plain") >= 2 and names.count("with-headers") >= 2

    drive(scheduler, two_each)
    assert len(sent) == len({h["leader_slot"] for h in sent})
    for headers in sent:
        assert type(headers["leader_epoch"]) is int
        assert headers["leader_epoch"] == scheduler.lease.epoch
        assert SLOT.match(headers["leader_slot"])
        if headers["leader_slot"].startswith("with-headers@"):
            assert headers["mine"] == "kept"
    # The headers went on a copy: the entries themselves are unchanged.
    assert scheduler.schedule["with-headers"].options == {"headers": {"mine": "kept"}}
    assert "headers" not in scheduler.schedule["plain"].options


def test_many_due_entries_are_claimed_in_one_store_call(
    app: Celery,
    make_scheduler: Callable[..., LeaderScheduler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count = 300
    app.conf.beat_schedule = {f"e{i}": every(60) for i in range(count)}
    long_ago = datetime.now(timezone.utc) - timedelta(minutes=5)
    seed_state(app, {f"e{i}": state(long_ago, 3) for i in range(count)})
    claims = Spy(monkeypatch, MemoryRecords, "claim")
    scheduler = make_scheduler()
    wait_leading(scheduler)
    # One tick as leader: everything is due, so it is all claimed in that one call.
    assert scheduler.tick() == 0.0
    assert [len(call[2]) for call in claims.calls] == [count]
    assert len(published(app)) == count
    # Nothing due: it sleeps until the entries poll, or until the next slot when the
    # test runs less than that before a whole minute (the grid of a 60 s entry).
    assert 0 < scheduler.tick() <= POLL_INTERVAL
    assert len(claims.calls) == 1


class Clock:
    """A wall clock the test moves by hand, for schedules built with ``nowfun``."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


@pytest.mark.parametrize("schedule", [timedelta(seconds=30), crontab(minute="*")], ids=repr)
def test_the_slot_names_its_exact_due_time(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], schedule: Any
) -> None:
    # Replicas must agree on a slot's name, so it has to come from the stored
    # last_run_at alone, not from two readings of the clock a few microseconds apart.
    # One slot fell due since last_run_at: 10 s ago, or at the start of this minute.
    now = datetime.now(timezone.utc).replace(microsecond=0)
    if isinstance(schedule, crontab):
        due = now.replace(second=0)
        last_run_at = due - timedelta(seconds=50)
    else:  # the newest slot of its grid (multiples of the period since the Unix epoch)
        due = Every(schedule).anchor(now)
        last_run_at = due - schedule + timedelta(seconds=5)
    app.conf.beat_schedule = {"e": {"task": "t.noop", "schedule": schedule}}
    seed_state(app, {"e": state(last_run_at, 1)})
    scheduler = make_scheduler()
    drive(
        scheduler,
        lambda: scheduler.schedule.get("e") and scheduler.schedule["e"].total_run_count == 2,
    )
    [headers] = published(app)
    assert headers["leader_slot"] == f"e@{due.isoformat(timespec='milliseconds')}"


def test_a_crontab_slot_that_falls_due_during_a_failover_is_sent_once(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(datetime(2030, 1, 1, 12, 0, 50, tzinfo=timezone.utc))
    monkeypatch.setattr(protocol, "utcnow", clock)
    app.conf.beat_schedule = {"cron": {"task": "t.cron", "schedule": crontab(nowfun=clock)}}
    first, second, third = make_scheduler(), make_scheduler(), make_scheduler()
    wait_leading(first)
    # All three replicas run from 12:00:50; the first one leads, 10 s before the slot.
    assert first.tick() == POLL_INTERVAL  # nothing due: only the entries poll wakes it
    assert second.tick() == third.tick() == FOLLOWER_INTERVAL
    first.close()  # gone before 12:01:00, having never sent "cron"
    clock.now = datetime(2030, 1, 1, 12, 1, 2, tzinfo=timezone.utc)
    survivor = wait_for(
        lambda: next((s for s in (second, third) if s.lease.is_leader()), None),
        3.0,
        message="no replica took over",
    )
    survivor.tick()
    assert [h["leader_slot"] for h in published(app)] == ["cron@2030-01-01T12:01:00.000+00:00"], (
        "the 12:01 slot must be sent once by the new leader"
    )
    survivor.close()
    last = third if survivor is second else second
    wait_leading(last)
    assert last.tick() == POLL_INTERVAL
    assert published(app) == []


def test_a_store_that_lost_its_data_does_not_make_a_former_leader_resend_a_slot(
    app: Celery, redis_url: str, redis_server: RedisServer
) -> None:
    # A restarted, empty store: the first replica to reach it must not fall back on its
    # own memory of the schedule, which is older than what later leaders sent.
    app.conf.leader_url = redis_url
    app.conf.beat_schedule = {"e": every(0.2)}
    old, new = replica(app, 1), replica(app, 2)
    try:
        wait_leading(old)
        new.lease.start()
        sent: list[dict[str, Any]] = []
        drive(old, lambda: sent.extend(published(app)) or len(sent) >= 2)
        asking = open_store(LeaderConfig.from_app(app))
        asking.lock.request_resign(ELECTION)
        asking.close()
        drive(old, new.lease.is_leader)
        drive(new, lambda: sent.extend(published(app)) or len(sent) >= 5)
        with redis_server.client() as client:
            client.flushall()
        new.close()
        wait_leading(old)
        drive(old, lambda: sent.extend(published(app)) or len(sent) >= 8)
    finally:
        old.close()
        new.close()
    slots = [h["leader_slot"] for h in sent]
    assert len(slots) == len(set(slots)), f"a slot was sent twice: {slots}"


def test_a_foreign_value_under_the_redis_state_key_is_logged_and_replaced(
    app: Celery,
    redis_url: str,
    redis_server: RedisServer,
    make_scheduler: Callable[..., LeaderScheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Not a hash at all (another program's key, or a botched manual fix): the leader
    # must still dispatch, not retry loading it on every tick forever.
    app.conf.leader_url = redis_url
    app.conf.beat_schedule = {"e": every(0.1)}
    with redis_server.client() as client:
        client.set("{celery_leader:beat}:state", "not a hash")
    scheduler = make_scheduler()
    with caplog.at_level(logging.WARNING, logger="celery_leader"):
        drive(scheduler, lambda: published(app), timeout=3.0)
    assert any(r.levelno >= logging.ERROR and "state" in r.getMessage() for r in caplog.records), (
        "replacing it deserves an error in the log"
    )
    with redis_server.client() as client:
        assert client.type("{celery_leader:beat}:state") == b"hash"


# -- beat in production (issue 13) and hardening (issue 14) ---------------------------


class RefusingBroker(Producer):  # type: ignore[misc]
    """A broker that refuses the connection: nothing of the message left this process."""

    attempts: list[str]

    def publish(self, body: Any, *args: Any, **kwargs: Any) -> Any:
        RefusingBroker.attempts.append((kwargs.get("headers") or {})["leader_slot"])
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as exc:
            raise OperationalError(f"Error 111 connecting to broker. {exc}") from exc


def test_a_definitely_unsent_slot_is_handed_back_and_the_leader_resigns(
    app: Celery,
    make_scheduler: Callable[..., LeaderScheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    app.conf.beat_schedule = {"e": every(0.3)}
    app.conf.leader_max_publish_failures = 2
    RefusingBroker.attempts = []
    caplog.set_level(logging.INFO, "celery_leader")
    failing = make_scheduler(Producer=RefusingBroker)
    drive(failing, lambda: len(RefusingBroker.attempts) >= 2)
    first = RefusingBroker.attempts[0]
    # The same slot, handed back after the first failure, was retried: and nothing else.
    assert RefusingBroker.attempts == [first, first]
    assert f"could not send slot {first}: nothing reached the broker" in caplog.text
    assert f"handed back unsent slot(s) {first}" in caplog.text
    assert "2 publishes failed in a row" in caplog.text
    assert not failing.lease.is_leader()
    stored = json.loads(stored_state(app)["e"])
    assert "slot" not in stored  # still the anchor: nothing recorded as sent

    # A replica that reaches the broker takes over and sends the handed-back slot.
    healthy = make_scheduler()
    healthy.leader_config = LeaderConfig.from_mapping(
        {**{k: app.conf.get(k) for k in ("leader_url", "leader_ttl")}, "leader_instance_id": "b"}
    )
    sent: list[dict[str, Any]] = []

    def sent_it() -> bool:
        failing.tick()
        sent.extend(published(app))
        return any(h["leader_slot"] == first for h in sent)

    drive(healthy, sent_it)
    assert healthy.lease.is_leader()
    assert [h["leader_slot"] for h in sent].count(first) == 1


class AnswerLost(Producer):  # type: ignore[misc]
    """The connection drops after the message was written: the broker may have it."""

    attempts: list[str]

    def publish(self, body: Any, *args: Any, **kwargs: Any) -> Any:
        AnswerLost.attempts.append((kwargs.get("headers") or {})["leader_slot"])
        raise TimeoutError("timed out waiting for the broker's answer")


def test_a_slot_whose_publish_outcome_is_unknown_stays_claimed(
    app: Celery,
    make_scheduler: Callable[..., LeaderScheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    app.conf.beat_schedule = {"e": every(0.2)}
    AnswerLost.attempts = []
    scheduler = make_scheduler(Producer=AnswerLost)
    drive(scheduler, lambda: len(AnswerLost.attempts) >= 2)
    first, second = AnswerLost.attempts[:2]
    assert first != second  # not retried: it may be in the broker already
    assert f"could not send slot {first} and the broker may have it" in caplog.text
    assert "handed back" not in caplog.text


def sentry_style_hook(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Patch ``Scheduler.apply_entry`` the way sentry-sdk's Crons integration does.

    It wraps the original on the class, reads the entry, adds its own headers to
    ``entry.options`` and calls through.
    """
    seen: list[dict[str, Any]] = []
    original = Scheduler.apply_entry

    def hooked(*args: Any, **kwargs: Any) -> Any:
        _scheduler, entry = args[0], args[1]
        headers = entry.options.pop("headers", {})
        headers.update({"sentry-monitor-slug": entry.name})
        entry.options["headers"] = headers
        seen.append(dict(headers))
        return original(*args, **kwargs)

    monkeypatch.setattr(Scheduler, "apply_entry", hooked)
    return seen


def test_a_hook_on_apply_entry_sees_every_slot_with_its_headers(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = sentry_style_hook(monkeypatch)
    app.conf.beat_schedule = {"a": every(0.1), "b": every(0.15)}
    scheduler = make_scheduler()
    sent: list[dict[str, Any]] = []

    def enough() -> bool:
        sent.extend(published(app))
        return len(sent) >= 8

    drive(scheduler, enough)
    assert [h["leader_slot"] for h in seen][: len(sent)] == [h["leader_slot"] for h in sent]
    assert all(h["sentry-monitor-slug"] == h["leader_slot"].split("@")[0] for h in sent)
    assert all(h["leader_epoch"] == scheduler.lease.epoch for h in seen)


def test_an_entry_overrides_the_missed_slots_setting(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slot 0 of the 10 s grid was the last sent; the (fixed) clock reads 3.6 periods later.
    ran = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    monkeypatch.setattr(protocol, "utcnow", lambda: ran + timedelta(seconds=36))
    app.conf.leader_missed_slots = "skip"
    app.conf.beat_schedule = {
        "skipped": every(10),
        "all": every(10, options={"leader_missed_slots": "all"}),
        "bad": every(10, options={"leader_missed_slots": "sometimes"}),
    }
    seed_state(app, {name: state(ran, 1) for name in app.conf.beat_schedule})
    scheduler = make_scheduler()
    wait_leading(scheduler)
    scheduler.tick()
    sent = published(app)
    assert sorted(h["leader_slot"].split("@")[0] for h in sent) == ["all"] * 3
    # The option is for the scheduler only: it does not reach the message.
    assert not any("leader_missed_slots" in str(h) for h in sent)


def test_a_stored_last_run_at_in_the_future_is_repaired_with_a_warning(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.beat_schedule = {"e": every(0.2), "ok": every(0.2)}
    seed_state(app, {"e": state(datetime(2099, 1, 1, tzinfo=timezone.utc), 7)})
    scheduler = make_scheduler()
    sent: list[dict[str, Any]] = []

    def both_run() -> bool:
        sent.extend(published(app))
        return len([h for h in sent if h["leader_slot"].startswith("e@")]) >= 2

    drive(scheduler, both_run)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "future" in r.message]
    assert len(warnings) == 1 and "'e'" in warnings[0].message
    assert json.loads(stored_state(app)["e"])["last_run_at"] < "2099"


def test_interval_entries_sharing_a_period_stay_in_one_claim_round_trip(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 50
    app.conf.beat_schedule = {f"e{i}": every(0.25) for i in range(count)}
    claims = Spy(monkeypatch, MemoryRecords, "claim")
    scheduler = make_scheduler()
    sent: list[dict[str, Any]] = []

    def rounds() -> bool:
        sent.extend(published(app))
        return len(sent) >= 6 * count

    drive(scheduler, rounds)
    # All on the 0.25 s grid since the Unix epoch: every slot of a round has one due time.
    dues = Counter(h["leader_slot"].split("@")[1] for h in sent)
    assert all(n == count for due, n in dues.items() if due != max(dues))
    assert all(round(due_of(f"x@{due}").timestamp() * 4, 6).is_integer() for due in dues)
    batches = [len(call[2]) for call in claims.calls]
    # The anchors, then one claim per round.
    assert batches[0] == count
    assert batches[1:] == [count] * (len(batches) - 1)
    assert len(batches) - 1 <= len(dues)


def test_entries_with_equal_schedules_share_one_series(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler]
) -> None:
    hourly = crontab(minute="7")
    app.conf.beat_schedule = {
        "shared-a": {"task": "t.noop", "schedule": hourly},
        "shared-b": {"task": "t.noop", "schedule": hourly},
        "equal": {"task": "t.noop", "schedule": crontab(minute="7")},
        "other": {"task": "t.noop", "schedule": crontab(minute="8")},
        "sec-a": every(30),
        "sec-b": every(30),
        "sec-c": every(60),
    }
    jobs = {job.name: job for job in make_scheduler().leader_jobs()}
    series = {name: job.series for name, job in jobs.items()}
    # Made once per distinct schedule (a large schedule has few), each still its own rule.
    assert series["shared-a"] is series["shared-b"] is series["equal"]
    assert series["other"] is not series["equal"]
    assert series["other"] is not None and series["other"].key() != series["equal"].key()
    assert series["sec-a"] is series["sec-b"]
    thirty = Every(timedelta(seconds=30)).key()
    assert series["sec-a"] is not None and series["sec-a"].key() == thirty
    assert series["sec-c"] is not series["sec-a"]


def test_merging_beat_schedule_keeps_celerys_rules(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler]
) -> None:
    scheduler = make_scheduler(lazy=True)
    kept = ScheduleEntry(name="kept", task="t.old", schedule=5.0, total_run_count=3, app=app)
    scheduler.schedule.update({"kept": kept, "gone": ScheduleEntry(name="gone", app=app)})
    copied = ScheduleEntry(name="elsewhere", task="t.copy", schedule=7.0, app=app)
    scheduler.merge_inplace(
        {"kept": {"task": "t.new", "schedule": 9.0}, "new": every(10), "copied": copied}
    )
    schedule = scheduler.schedule
    assert set(schedule) == {"kept", "new", "copied"}  # what is not in beat_schedule goes
    # An entry already there is updated in place: its run count stays.
    assert schedule["kept"] is kept and kept.task == "t.new" and kept.total_run_count == 3
    assert kept.schedule.run_every == timedelta(seconds=9)
    assert schedule["new"].last_run_at is not None and schedule["new"].task == "t.noop"
    assert schedule["copied"].name == "copied" and schedule["copied"].task == "t.copy"


def test_a_large_schedule_is_built_without_the_collector_and_then_left_out_of_its_scans(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(beat_adapter, "FREEZE_AT", 3)
    app.conf.beat_schedule = {f"e{i}": every(60) for i in range(3)}
    enabled_while_building = []
    merge = beat.LeaderScheduler.merge_inplace

    def spied(self: LeaderScheduler, b: dict[str, Any]) -> None:
        enabled_while_building.append(gc.isenabled())
        merge(self, b)

    monkeypatch.setattr(beat.LeaderScheduler, "merge_inplace", spied)
    assert gc.isenabled()
    try:
        make_scheduler()
        assert enabled_while_building == [False] and gc.isenabled()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    # A process that turned the collector off keeps it off, and nothing is frozen.
    gc.disable()
    try:
        make_scheduler()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


@pytest.mark.timing  # the lease thread steps down within 1 s of the watchdog
def test_health_file_follows_the_role_and_the_watchdog(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], tmp_path: Any, rival: Lease
) -> None:
    from celery_leader.probes.health import check

    path = tmp_path / "health.json"
    app.conf.beat_schedule = {"e": every(0.2)}
    app.conf.leader_health_file = str(path)
    app.conf.leader_tick_timeout = 0.5
    scheduler = make_scheduler()
    drive(scheduler, lambda: path.exists() and json.loads(path.read_text())["role"] == "leader")
    ok, line = check(path)
    assert ok, line
    assert line.startswith("OK: leader of 'beat' (epoch ")
    data = json.loads(path.read_text())
    assert data["store_reachable"] is True and data["epoch"] == scheduler.lease.epoch
    # No tick for longer than the watchdog's bound: the probe fails and the lease goes.
    time.sleep(0.7)
    ok, line = check(path)
    assert not ok and "tick is overdue" in line
    wait_for(lambda: not scheduler.lease.is_leader(), 1, message="the hung leader kept leading")
    rival.start()
    wait_for(rival.is_leader, 2, message="the rival never took over")
    scheduler.tick()
    ok, line = check(path)
    assert ok and line.startswith("OK: follower of 'beat'"), line


def test_a_term_lost_while_loading_the_state_is_named_as_such(
    app: Celery,
    make_scheduler: Callable[..., LeaderScheduler],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The store refuses every anchor claim at once: what it does when the term is gone.
    app.conf.beat_schedule = {"a": every(5), "b": every(5)}
    monkeypatch.setattr(MemoryRecords, "claim", lambda self, fence, claims: [False] * len(claims))
    scheduler = make_scheduler()
    wait_leading(scheduler)
    assert scheduler.tick() == FOLLOWER_INTERVAL
    assert "ended while loading the schedule state" in caplog.text
    assert "changed while loading" not in caplog.text


def test_a_stop_signal_during_a_publish_waits_until_the_claimed_slot_is_sent(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery beat raises SystemExit from its SIGTERM handler; between a slot's claim
    and its publish that would lose the slot."""
    app.conf.beat_schedule = {"a": every(0.1)}
    scheduler = make_scheduler()
    original = Scheduler.apply_async
    signalled: list[bool] = []

    def apply_async(self: Scheduler, *args: Any, **kwargs: Any) -> Any:
        if not signalled:
            signalled.append(True)
            os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-publish
            time.sleep(0.05)  # a Python handler would have run by now
        return original(self, *args, **kwargs)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(143)  # what celery.apps.beat installs

    monkeypatch.setattr(Scheduler, "apply_async", apply_async)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(SystemExit):
            drive(scheduler, lambda: False)
    finally:
        signal.signal(signal.SIGTERM, previous)
    sent = published(app)
    assert signalled and len(sent) == 1, sent
    assert json.loads(stored_state(app)["a"])["slot"] == sent[0]["leader_slot"]


def test_a_stop_signal_inside_a_store_call_closes_beat_after_the_tick(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's SIGTERM handler closes the scheduler where the main thread is. Inside a
    store call that holds a lock closing the store takes, that waited forever (seen
    on PostgreSQL: the kept session's lock, taken by the entries-version check)."""
    app.conf.beat_schedule = {"a": every(5)}
    scheduler = make_scheduler()
    wait_leading(scheduler)
    store_lock = threading.Lock()  # stands for the store's own, not reentrant
    original = MemoryEntries.version
    signalled: list[bool] = []
    closed: list[bool] = []

    def entries_version(self: MemoryEntries, election: str) -> int:
        with store_lock:
            if not signalled:
                signalled.append(True)
                os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-call, once
                time.sleep(0.05)  # a Python handler would have run by now
            return original(self, election)

    def stop(signum: int, frame: object) -> None:
        # What celery.apps.beat installs: close the scheduler, then exit.
        if not store_lock.acquire(timeout=2):
            raise AssertionError("the stop handler ran inside the store call")
        store_lock.release()
        scheduler.close()
        closed.append(True)
        raise SystemExit(143)

    monkeypatch.setattr(MemoryEntries, "version", entries_version)
    monkeypatch.setattr(EntryFeed, "current", lambda self: {} if closed else _asks(self))
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(SystemExit):
            scheduler.tick()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signalled and closed


def test_a_stop_signal_sent_twice_during_a_tick_stops_at_once() -> None:
    """Whoever sends the same stop signal again will not wait for the tick."""
    seen: list[str] = []

    def stop(signum: int, frame: object) -> None:
        seen.append("handled")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with beat._stop_signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            seen.append("held")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            seen.append("in the block")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == ["held", "handled", "in the block"]


def _asks(feed: Any) -> dict[str, Any]:
    """The feed's question to the store, every time."""
    feed.store.version(feed.election)
    return {}


def test_a_follower_makes_its_jobs_a_slice_per_tick_and_a_promotion_makes_the_rest(
    app: Celery,
    make_scheduler: Callable[..., LeaderScheduler],
    rival: Lease,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replicas started together leave the CPU to the one elected: a follower makes
    code entries' jobs a slice per tick (no time at all here: one job per tick)."""
    monkeypatch.setattr(beat, "WARM_SLICE", 0.0)
    app.conf.beat_schedule = {f"e{i}": every(60) for i in range(5)}
    rival.start()
    wait_for(rival.is_leader, 3.0, message="the rival never led")
    scheduler = make_scheduler()
    adapter = scheduler._protocol.adapter
    assert adapter._made == {}, "nothing made at start-up"
    for made in (1, 2):
        assert scheduler.tick() == beat.FOLLOWER_INTERVAL
        assert len(adapter._made) == made
    early = {name: known[2] for name, known in adapter._made.items()}
    rival.stop()
    wait_leading(scheduler)
    scheduler.tick()
    jobs = scheduler._protocol.held.jobs
    assert set(jobs) == {f"e{i}" for i in range(5)}, "the promotion made the rest"
    assert all(jobs[name] is job for name, job in early.items()), "and kept those made"


def test_a_follower_ends_up_with_every_job_made(
    app: Celery, make_scheduler: Callable[..., LeaderScheduler], rival: Lease
) -> None:
    app.conf.beat_schedule = {f"e{i}": every(60) for i in range(5)}
    rival.start()
    wait_for(rival.is_leader, 3.0, message="the rival never led")
    scheduler = make_scheduler()
    scheduler.tick()  # well within one slice
    adapter = scheduler._protocol.adapter
    assert {j.name for j in adapter._listed or ()} == {f"e{i}" for i in range(5)}
