"""Bursts: pipelined publishes and batch after batch in one tick, on the slot protocol alone.

The adapter here buffers what it is sent, as Celery's does on a Redis broker,
and delivers it on ``flush()``; the test decides how a flush ends. The store is
the in-process memory store; the clock is the test's. The last test runs Celery
beat's own publisher against a real Redis broker.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone

import pytest
import redis
from celery import Celery
from kombu.exceptions import EncodeError

from celery_leader.celery.publishing import BeatPublisher
from celery_leader.schedule import protocol
from celery_leader.schedule.jobs import Adapter, Job, Outcome
from celery_leader.schedule.publisher import PIPELINE
from celery_leader.schedule.series import Every
from celery_leader.settings.config import LeaderConfig
from harness.waiting import wait_for

PERIOD = timedelta(seconds=10)
#: A slot of every entry's 10 s grid.
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
logger = logging.getLogger("tests.burst")


class Buffering(Adapter):
    """Buffers sends; ``flush()`` delivers them, or fails as ``failures`` says (in turn)."""

    def __init__(self, n: int) -> None:
        self._jobs = [Job(f"e{i:04d}", Every(PERIOD), "once", None) for i in range(n)]
        self.buffer: list[str] = []
        self.delivered: list[str] = []
        self.flushes = 0
        self.failures: list[Outcome | None] = []  # outcome of each flush to come; None: deliver

    def jobs(self) -> Sequence[Job]:
        return self._jobs

    def send(self, job: Job, slot: str, due: datetime, epoch: int) -> Outcome:
        self.buffer.append(slot)
        return Outcome()

    def flush(self) -> Outcome:
        self.flushes += 1
        failure = self.failures.pop(0) if self.failures else None
        buffered, self.buffer = self.buffer, []
        if failure is not None:
            return failure
        self.delivered += buffered
        return Outcome()


class Run:
    def __init__(self, n: int) -> None:
        config = LeaderConfig.from_mapping(
            {"leader_url": f"memory://{uuid.uuid4().hex}", "leader_ttl": 5}
        )
        self.now = T0 - timedelta(seconds=1)
        self.adapter = Buffering(n)
        self.protocol = protocol.SlotProtocol(
            config, self.adapter, logger, idle=0.01, max_sleep=60, clock=lambda: self.now
        )
        wait_for(self.protocol.lease.is_leader, 5, message="the memory store never elected")

    def burst(self) -> None:
        """Anchor every entry before T0, then tick past T0 until nothing is due."""
        assert self.protocol.tick() > 0
        self.now = T0 + timedelta(seconds=1)
        for _ in range(100):
            if self.protocol.tick() > 0:
                return
        raise AssertionError("the burst never ended")

    def slots(self, n: int) -> list[str]:
        due = T0.isoformat(timespec="milliseconds")
        return [f"e{i:04d}@{due}" for i in range(n)]


@pytest.fixture
def run() -> Iterator[Callable[[int], Run]]:
    made: list[Run] = []

    def make(n: int) -> Run:
        made.append(Run(n))
        return made[-1]

    yield make
    for r in made:
        r.protocol.close()


def test_a_burst_goes_out_in_pipelined_flushes_and_in_one_tick(
    run: Callable[[int], Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "BATCH", 120)  # several claim batches, not a multiple of PIPELINE
    r = run(2 * PIPELINE + 50)
    assert r.protocol.tick() > 0  # anchors
    r.now = T0 + timedelta(seconds=1)
    assert r.protocol.tick() == 0  # every batch of the burst in this one tick
    assert r.adapter.delivered == r.slots(2 * PIPELINE + 50)
    # Flushed every PIPELINE slots and at the end of each claim batch: 100 + 20, twice, then 10.
    assert r.adapter.flushes == 5
    assert r.protocol.tick() > 0


def test_a_flush_that_reached_nothing_hands_its_slots_back(run: Callable[[int], Run]) -> None:
    r = run(2 * PIPELINE + 50)
    refused = Outcome(ConnectionRefusedError("refused"), definitely_unsent=True)
    r.adapter.failures = [None, refused]
    r.burst()
    assert sorted(r.adapter.delivered) == r.slots(2 * PIPELINE + 50)  # each exactly once


def test_a_flush_of_unknown_outcome_leaves_its_slots_claimed_and_unsent(
    run: Callable[[int], Run],
) -> None:
    r = run(2 * PIPELINE + 50)
    r.adapter.failures = [None, Outcome(TimeoutError("no answer"))]
    r.burst()
    slots = r.slots(2 * PIPELINE + 50)
    lost = slots[PIPELINE : 2 * PIPELINE]  # the second flush: maybe in the broker, never resent
    assert sorted(r.adapter.delivered) == [s for s in slots if s not in lost]
    stored = r.protocol.runtime.store.records.load(r.protocol.lease.election)
    assert all(f'"last_run_at": "{T0.isoformat()}"' in stored[s.partition("@")[0]] for s in lost)


def test_beat_pipelines_to_redis_and_a_failed_publish_keeps_what_was_buffered(
    redis_url: str,
) -> None:
    """On a real Redis broker: nothing arrives before the flush, and a publish that
    fails inside the pipeline neither drops nor delays what was buffered before it."""
    app = Celery("burst", broker=redis_url, set_as_current=False)
    publisher = BeatPublisher(app, confirm_timeout=1.0)
    broker = redis.Redis.from_url(redis_url)
    try:
        with publisher.pipelined():
            for n in range(3):
                app.send_task("burst.noop", args=(n,), producer=publisher.producer())
            assert broker.llen("celery") == 0  # buffered
            with pytest.raises(EncodeError) as failed:
                app.send_task("burst.noop", args=(object(),), producer=publisher.producer())
            assert publisher.definitely_unsent(failed.value)
            publisher.flush()
            assert broker.llen("celery") == 3
    finally:
        publisher.release()
        broker.close()
