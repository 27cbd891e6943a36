"""One consumer-liveness rule for Celery workers and Dramatiq processes."""

from __future__ import annotations

import pytest

from celery_leader.probes import health
from celery_leader.probes.health import ConsumerLiveness


class Now:
    def __init__(self) -> None:
        self.value = 100.0

    def __call__(self) -> float:
        return self.value


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> Now:
    clock = Now()
    monkeypatch.setattr(health.time, "monotonic", clock)
    return clock


def test_starts_cut_off_and_events_keep_it_alive_however_long(now: Now) -> None:
    """Celery's way: connected until told otherwise, then a grace before it counts."""
    consumer = ConsumerLiveness("the worker's broker consumer", 2.0)
    now.value += 2.0
    assert consumer.problem() is None, "within the grace"
    now.value += 0.5
    assert consumer.problem() == "the worker's broker consumer has not reached the broker for 2.5 s"
    consumer.connected()
    now.value += 1000.0
    assert consumer.problem() is None, "connected needs no heartbeat"
    consumer.disconnected()
    now.value += 1.0
    consumer.disconnected()  # a second notice does not restart the grace
    now.value += 1.5
    assert consumer.problem() == "the worker's broker consumer has not reached the broker for 2.5 s"


def test_heartbeats_keep_it_alive_for_the_grace_each(now: Now) -> None:
    """Dramatiq's way: every round of the consumer loop is a heartbeat."""
    consumer = ConsumerLiveness("consumer of 'q.DQ'", 2.0)
    for _ in range(5):
        now.value += 1.5
        consumer.alive()
        assert consumer.problem() is None
    now.value += 3.0
    assert consumer.problem() == "consumer of 'q.DQ' has not reached the broker for 3.0 s"
