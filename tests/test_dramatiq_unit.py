"""Dramatiq support without processes: schedules, settings, actor options, the
fail-closed check and the scheduler's claims, on Dramatiq's stub broker and the
in-process memory store."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

import celery_leader
from celery_leader.backends import open_store
from celery_leader.dramatiq import (
    LeaderActorError,
    LeaderMiddleware,
    cron,
    current_epoch,
    every,
    is_leader,
)
from celery_leader.dramatiq.scheduler import DramatiqScheduler
from celery_leader.election.lease import Lease
from celery_leader.election.lease_set import lease_set
from celery_leader.exceptions import ConfigError, LeaderError
from harness.waiting import wait_for

UTC = timezone.utc


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


# -- schedules -----------------------------------------------------------------


def test_every_aligns_fractional_periods_to_multiples_since_the_epoch() -> None:
    schedule = every(0.2)
    assert schedule.next_after(utc(2026, 1, 1, 0, 0, 0) + timedelta(microseconds=1)) == utc(
        2026, 1, 1, 0, 0, 0
    ) + timedelta(milliseconds=200)
    assert schedule.next_after(utc(2026, 1, 1, 0, 0, 0)) == utc(2026, 1, 1) + timedelta(
        milliseconds=200
    )
    # Counting the slots between two instants is arithmetic, not a walk.
    first = utc(2026, 1, 1)
    newest, count = schedule.walk(first, first + timedelta(seconds=1.05), 1)
    assert (newest, count) == ([first + timedelta(seconds=1)], 5)
    assert every(60).next_after(utc(2026, 1, 1, 10, 0, 30)) == utc(2026, 1, 1, 10, 1)


@pytest.mark.parametrize("bad", [0, -1, 0.0005, float("nan"), "5", True])
def test_every_refuses_bad_periods(bad: Any) -> None:
    with pytest.raises(ConfigError, match="every"):
        every(bad)


def test_cron_runs_once_when_berlin_clocks_go_back() -> None:
    schedule = cron("30 2 * * *", tz="Europe/Berlin")
    slots = [schedule.next_after(utc(2026, 10, 24, 12))]
    for _ in range(2):
        slots.append(schedule.next_after(slots[-1]))
    # 25 Oct 2026: 02:30 CEST happens once (00:30 UTC), not again at 02:30 CET.
    assert slots == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30), utc(2026, 10, 27, 1, 30)]


def test_cron_runs_at_three_when_berlin_clocks_jump_forward() -> None:
    schedule = cron("30 2 * * *", tz="Europe/Berlin")
    slots = [schedule.next_after(utc(2026, 3, 28, 12))]
    slots.append(schedule.next_after(slots[-1]))
    # 29 Mar 2026 has no 02:30: the job runs at 03:00 CEST (01:00 UTC), once.
    assert slots == [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]


def test_cron_defaults_to_utc_not_the_host_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    assert cron("0 3 * * *").next_after(utc(2026, 6, 1)) == utc(2026, 6, 1, 3)


def test_cron_refuses_bad_expressions_and_zones() -> None:
    with pytest.raises(ConfigError, match="invalid"):
        cron("61 * * * *")
    with pytest.raises(ConfigError, match="tz"):
        cron("* * * * *", tz="Mars/Olympus")


# -- settings ------------------------------------------------------------------


def test_arguments_win_and_the_rest_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CELERY_LEADER_URL", "memory://env")
    monkeypatch.setenv("CELERY_LEADER_TTL", "9")
    middleware = LeaderMiddleware(ttl=6, worker_election="reports")
    assert middleware.config.url == "memory://env"
    assert middleware.config.ttl == 6
    assert middleware.config.worker_election == "reports"


def test_bad_values_fail_at_construction_naming_the_argument_or_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match=r"^ttl= must be a number") as info:
        LeaderMiddleware(url="memory://", ttl="soon")  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    monkeypatch.setenv("CELERY_LEADER_RENEW_INTERVAL", "-1")
    with pytest.raises(ConfigError, match="CELERY_LEADER_RENEW_INTERVAL"):
        LeaderMiddleware(url="memory://")


def test_no_url_at_all_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_LEADER_URL", raising=False)
    with pytest.raises(ConfigError, match=r"needs url= .*CELERY_LEADER_URL"):
        LeaderMiddleware()


def test_under_django_the_settings_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.conf import LazySettings

    settings = LazySettings()
    settings.configure(CELERY_LEADER_URL="memory://django", CELERY_LEADER_TTL=7)
    monkeypatch.setattr("django.conf.settings", settings)
    monkeypatch.setenv("CELERY_LEADER_URL", "memory://env")
    config = LeaderMiddleware().config
    assert (config.url, config.ttl) == ("memory://django", 7)


# -- actor options ---------------------------------------------------------------


@pytest.fixture
def broker() -> Iterator[StubBroker]:
    broker = StubBroker()
    middleware = LeaderMiddleware(url="memory://unit", ttl=1, key_prefix=f"t{id(broker)}")
    broker.add_middleware(middleware)
    dramatiq.set_broker(broker)
    yield broker
    middleware.campaign.stop()
    broker.close()


def leader_of(broker: StubBroker) -> LeaderMiddleware:
    return next(m for m in broker.middleware if isinstance(m, LeaderMiddleware))


def test_a_queue_mixing_leader_only_and_ordinary_actors_fails_at_import(
    broker: StubBroker,
) -> None:
    dramatiq.actor(queue_name="q", leader_only=True)(lambda: None)
    with pytest.raises(LeaderActorError, match="queue 'q' mixes"):

        @dramatiq.actor(queue_name="q")
        def ordinary() -> None: ...


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"leader_only": True, "leader_on_follower": "retry"}, "leader_on_follower must be"),
        ({"leader_on_follower": "wait"}, "needs leader_only"),
        ({"leader_only": 3}, "leader_only must be"),
        ({"leader_schedule": "hourly"}, "leader_schedule must be"),
        ({"leader_schedule": [every(1), every(2)]}, "share a name"),
    ],
)
def test_unknown_option_values_fail_at_import(
    broker: StubBroker, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(LeaderActorError, match=match):

        @dramatiq.actor(**options)
        def actor() -> None: ...


def test_two_actors_with_one_entry_name_fail_at_import(broker: StubBroker) -> None:
    dramatiq.actor(leader_schedule=every(60, name="sync"))(lambda: None)
    with pytest.raises(LeaderActorError, match="named 'sync' too"):

        @dramatiq.actor(leader_schedule=cron("0 * * * *", name="sync"))
        def other() -> None: ...


def test_skip_mode_fails_closed_when_the_check_raises(
    broker: StubBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[int] = []

    @dramatiq.actor(queue_name="guarded", leader_only=True, leader_on_follower="skip")
    def guarded(n: int) -> None:
        ran.append(n)

    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        lease = leader_of(broker).campaign.lease()
        wait_for(lease.is_leader, 5, message="the only process leads")
        guarded.send(1)
        broker.join("guarded")
        worker.join()
        assert ran == [1]

        def broken(self: Lease) -> bool:
            raise RuntimeError("injected")

        monkeypatch.setattr(Lease, "is_leader", broken)
        guarded.send(2)
        broker.join("guarded")
        worker.join()
        assert ran == [1], "the body ran although the leadership check failed"
    finally:
        worker.stop()


class _ResignAfterTheCheck(dramatiq.Middleware):
    """Runs after the leader check and before the actor: the lease resigns in that window."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    def before_process_message(self, broker: Any, message: Any) -> None:
        self.lease.step_down("leader resign", sit_out=60)


def _through_a_resign(broker: StubBroker, body: Any, then: Any = None) -> int:
    """Send ``body`` (an actor of queue "leader") once while this process leads, with
    the lease resigning after the check let it in, on one worker thread (so that
    ``then``, an actor of queue "ordinary" sent next, runs where the body ran);
    return the epoch the check passed with."""
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        lease = leader_of(broker).campaign.lease()
        epoch: int = wait_for(lambda: lease.epoch, 5, message="the only process leads")
        broker.add_middleware(_ResignAfterTheCheck(lease))
        for actor, queue in ((body, "leader"), (then, "ordinary")):
            if actor is not None:
                actor.send()
                broker.join(queue)
                worker.join()
    finally:
        worker.stop()
    return epoch


@pytest.mark.parametrize("mode", ["wait", "skip"])
def test_a_body_let_through_while_leading_runs_with_that_epoch_after_a_resign(
    broker: StubBroker, mode: str
) -> None:
    seen: list[tuple[int | None, bool]] = []
    after: list[int | None] = []

    @dramatiq.actor(queue_name="leader", leader_only=True, leader_on_follower=mode)
    def body() -> None:
        # The body's first line: the lease resigned after the check let it in.
        seen.append((current_epoch(), is_leader()))

    @dramatiq.actor(queue_name="ordinary")
    def next_message() -> None:
        after.append(current_epoch())

    epoch = _through_a_resign(broker, body, then=next_message)
    # It runs with the epoch it passed with; is_leader() tells the truth about now.
    assert seen == [(epoch, False)]
    assert after == [None], "the body's epoch outlived the body in its worker thread"


def test_an_async_actor_runs_with_the_epoch_it_passed_with_after_a_resign(
    broker: StubBroker,
) -> None:
    """An async actor's coroutine runs on Dramatiq's event-loop thread, in a copy
    of the worker thread's context (asyncio copies it when the worker hands the
    coroutine over): it reads the epoch its message passed with, as a sync one."""
    from dramatiq.middleware.asyncio import AsyncIO

    broker.add_middleware(AsyncIO())
    seen: list[tuple[int | None, bool]] = []

    @dramatiq.actor(queue_name="leader", leader_only=True)
    async def body() -> None:
        seen.append((current_epoch(), is_leader()))

    epoch = _through_a_resign(broker, body)
    assert seen == [(epoch, False)]


# -- the scheduler ---------------------------------------------------------------


def test_a_new_scheduler_continues_from_the_store_and_folds_missed_slots(
    broker: StubBroker,
) -> None:
    @dramatiq.actor(queue_name="ticks", leader_schedule=every(0.1, kwargs={"x": 1}, name="t"))
    def tick(x: int) -> None: ...

    config = leader_of(broker).config

    def run_until(count: int) -> None:
        scheduler = DramatiqScheduler(broker, config)
        stop = threading.Event()
        thread = threading.Thread(target=scheduler.run, args=(stop,))
        thread.start()
        try:
            wait_for(lambda: len(broker.queues["ticks"].queue) >= count, 5, message="slots sent")
        finally:
            stop.set()
            thread.join()

    run_until(3)
    stopped = datetime.now(UTC)
    wait_for(lambda: datetime.now(UTC) > stopped + timedelta(seconds=0.45), 2)
    run_until(len(broker.queues["ticks"].queue) + 2)
    queue = broker.queues["ticks"]
    messages = [dramatiq.Message.decode(queue.get_nowait()) for _ in range(queue.qsize())]
    slots = [m.options["leader_slot"] for m in messages]
    assert len(slots) == len(set(slots))
    assert all(s.startswith("t@") and s.endswith("+00:00") for s in slots)
    assert {m.kwargs["x"] for m in messages} == {1}
    dues = sorted(datetime.fromisoformat(s[2:]) for s in slots)
    gaps = [(b - a).total_seconds() for a, b in pairwise(dues)]
    # The slots missed between the two schedulers went out as one (the latest).
    assert max(gaps) >= 0.4, gaps
    outage = [d for d in dues if stopped < d < stopped + timedelta(seconds=0.4)]
    assert len(outage) <= 1, (outage, stopped)
    epochs = [m.options["leader_epoch"] for m in messages]
    assert epochs == sorted(epochs) and len(set(epochs)) == 2


class _ConsumerThread:
    """What the gate uses of Dramatiq's ConsumerThread; records what happened."""

    worker_timeout = 1000

    def __init__(self, queue_name: str) -> None:
        self.queue_name = queue_name
        self.paused = False
        self.handed: list[str] = []  # put on the work queue
        self.acked: list[str] = []
        self.requeued: list[str] = []
        self.closes = 0
        self.stopped = False

    def handle_message(self, message: Any) -> None:
        self.handed.append(message.message_id)

    def post_process_message(self, message: Any) -> None:
        self.acked.append(message.message_id)

    def requeue_messages(self, messages: Any) -> None:
        self.requeued.extend(m.message_id for m in messages)

    def handle_delayed_messages(self) -> None: ...

    def close(self) -> None:
        self.closes += 1

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def stop(self) -> None:
        self.stopped = True


class _Worker:
    def __init__(self, *threads: _ConsumerThread) -> None:
        self.consumers = {t.queue_name: t for t in threads}


def test_wait_mode_hands_messages_to_workers_only_while_leading_and_acks_none_it_held(
    broker: StubBroker,
) -> None:
    from dramatiq.middleware import SkipMessage

    @dramatiq.actor(queue_name="reports", leader_only=True)  # wait: the default
    def report() -> None: ...

    middleware = leader_of(broker)
    # Another process leads the worker election of the same store.
    other = Lease.from_config("worker", middleware.config, open_store(middleware.config).lock)
    other.start()
    wait_for(other.is_leader, 5)
    thread, delay = _ConsumerThread("reports"), _ConsumerThread("reports.DQ")
    try:
        middleware.after_consumer_thread_boot(broker, thread)
        middleware.after_consumer_thread_boot(broker, delay)
        middleware.after_worker_boot(broker, _Worker(thread, delay))
        assert thread.paused and not delay.paused
        other.stop()  # the leader hands over: this process is elected and consumes
        wait_for(lambda: not thread.paused, 5, message="resumed")
        first, second = (dramatiq.broker.MessageProxy(report.message()) for _ in range(2))
        thread.handle_message(first)
        assert thread.handed == [first.message_id]
        middleware.campaign.lease().step_down("test", sit_out=10)
        # Delivered after the demotion: held in the consumer thread, never handed over.
        thread.handle_message(second)
        assert thread.handed == [first.message_id]
        # Handed over before, started after: not run, and its ack is skipped.
        with pytest.raises(SkipMessage):
            middleware.before_process_message(broker, first)
        assert not thread.paused, "paused while a message it delivered was in the process"
        thread.post_process_message(first)
        assert thread.acked == []
        assert thread.requeued == [second.message_id, first.message_id]
        assert thread.paused, "not paused once drained"
        thread.close()
        assert thread.paused
        middleware.campaign.stop()  # on shutdown: never campaigns again
        with pytest.raises(LeaderError, match="shutting down"):
            middleware.campaign.lease()
    finally:
        other.stop()


def test_a_stopping_leader_ends_its_wait_queue_consumer_instead_of_pausing_it(
    broker: StubBroker,
) -> None:
    """At shutdown the leader's gated consumer is stopped, not paused.

    Dramatiq's consumer leaves its loop when paused and, its worker still running,
    sleeps its restart delay (3 s) before looking again; the worker's shutdown then
    waited for that sleep: a replica whose worker process led took 3 s longer to exit
    on SIGTERM (tests/test_dramatiq_chaos.py, ``term_main``).
    """

    @dramatiq.actor(queue_name="reports", leader_only=True)
    def report() -> None: ...

    middleware = leader_of(broker)
    thread = _ConsumerThread("reports")
    middleware.after_consumer_thread_boot(broker, thread)
    middleware.after_worker_boot(broker, _Worker(thread))
    wait_for(lambda: not thread.paused, 5, message="elected and consuming")
    middleware.campaign.stop()
    assert thread.stopped and not thread.paused


def test_a_failed_rabbitmq_connection_logs_no_pika_errors(caplog: pytest.LogCaptureFixture) -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.errors import ConnectionClosed

    from celery_leader.dramatiq.pika_logs import quiet_connect_errors

    broker = RabbitmqBroker(url="amqp://guest:guest@127.0.0.1:1/")  # nothing listens
    quiet_connect_errors(broker)
    caplog.set_level(logging.INFO)
    with pytest.raises(ConnectionClosed, match="Connection refused"):
        broker.enqueue(dramatiq.Message("q", "a", (), {}, {}))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConnectionClosed):
        broker.enqueue(dramatiq.Message("q", "a", (), {}, {}))
    assert any(r.name.startswith("pika") and r.levelname == "DEBUG" for r in caplog.records)


def test_only_a_worker_consuming_a_leader_only_queue_campaigns(broker: StubBroker) -> None:
    @dramatiq.actor(queue_name="reports", leader_only=True)
    def report() -> None: ...

    middleware = leader_of(broker)
    # `dramatiq app --queues default`: this worker does not consume "reports".
    middleware.after_worker_boot(broker, _Worker(_ConsumerThread("default")))
    assert not middleware.campaign.campaigns()
    with pytest.raises(LeaderError, match="does not campaign"):
        middleware.campaign.lease()
    assert not is_leader()
    assert celery_leader.leader_of(middleware.process_config()) is None  # nobody holds the role


def test_is_leader_outside_a_worker_never_joins(broker: StubBroker) -> None:
    @dramatiq.actor(queue_name="reports", leader_only=True)
    def report() -> None: ...

    middleware = leader_of(broker)
    config = middleware.process_config()
    assert not is_leader() and current_epoch() is None
    assert lease_set(config).elections() == []  # it joined nothing
    assert celery_leader.leader_of(config) is None  # and nobody campaigns

    # A lease another part of this process joined (the scheduler's, say) answers.
    scheduler = lease_set(config).join(config.beat_election)
    try:
        holder = wait_for(lambda: celery_leader.leader_of(config, config.beat_election), 5)
        assert holder.instance_id == config.instance_id
        assert is_leader(config.beat_election)
        assert current_epoch(config.beat_election) == holder.epoch
    finally:
        scheduler.leave()
    assert not is_leader(config.beat_election)

    # So does a worker process that consumes the election's actors, once it booted.
    middleware.after_worker_boot(broker, _Worker(_ConsumerThread("reports")))
    holder = wait_for(lambda: celery_leader.leader_of(config), 5, message="elected")
    assert holder.instance_id == config.instance_id
    assert is_leader() and current_epoch() == holder.epoch


@pytest.mark.parametrize(
    ("variable", "value"),
    [("CELERY_LEADER_FENCE_TASKS", "true"), ("CELERY_LEADER_CRONTAB_DST", "celery")],
)
def test_a_celery_only_setting_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"^{variable}.* is for Celery") as caught:
        LeaderMiddleware(url="memory://refused")
    assert "\n" not in str(caught.value)
