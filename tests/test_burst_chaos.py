"""A burst across a crash: the leader is SIGKILLed while 20,000 slots due together go out.

Two real ``celery beat`` replicas of the beat test app share a Redis broker and a
Redis lease store. Every entry's stored state says it last ran one period ago,
so the slot of the latest grid point is due for all of them at once when the
first replica starts leading. It is SIGKILLed once a quarter of the burst is in
the broker, in the middle of a claim batch; the standby takes over and sends the rest.

Counted at the broker, by ``leader_slot``: no slot is there twice, and every
slot is either there or was claimed by the killed leader in the claim batch it
was publishing (the default promise, "never twice, maybe lost": what a crash
loses is bounded by one claim batch).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis

from celery_leader.backends import Fence, Write, open_store
from celery_leader.schedule.protocol import BATCH
from celery_leader.schedule.publisher import PIPELINE
from celery_leader.schedule.state import dump_state, slot_name
from celery_leader.settings.config import LeaderConfig
from harness.procs import Procs
from harness.servers import RedisServer
from harness.waiting import wait_for

pytestmark = pytest.mark.slow

CELERY = Path(sys.executable).with_name("celery")
REPO = Path(__file__).resolve().parents[1]
PYTHONPATH = os.environ.get("PYTHONPATH")
N = 20_000
#: The entries' period. Any grid puts them all in one second; a long one keeps
#: a second slot from falling due while the test runs (its grid points are 30
#: days apart, the test takes a minute).
PERIOD = timedelta(days=30)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: The default ttl: a crashed holder's closed connection hands over at once on
#: Redis, and ticks of a burst stay far from a tick timeout this long.
TTL = 15.0


def names() -> list[str]:
    """The entries of the beat test app with BEAT_ENTRIES=N."""
    return ["tick", *(f"tick{i}" for i in range(1, N))]


def seed(store_url: str, due: datetime) -> None:
    """Store what a previous leader would leave: every entry last ran one period before ``due``."""
    config = LeaderConfig.from_mapping({"leader_url": store_url, "leader_ttl": TTL})
    backend = open_store(config)
    try:
        term = backend.lock.acquire(config.beat_election, "previous-leader", TTL, 0).term
        assert term is not None
        state = dump_state(due - PERIOD, 1, term.epoch, "previous-leader")
        claims = [Write(name, None, state) for name in names()]
        assert all(backend.records.claim(Fence(config.beat_election, term), claims))
        backend.lock.release(config.beat_election, term)
    finally:
        backend.close()


def published(broker: redis.Redis[bytes]) -> list[tuple[str, int]]:
    """``(leader_slot, leader_epoch)`` of every message in the ``celery`` queue."""
    raws = broker.lrange("celery", 0, -1)
    return [
        (h["leader_slot"], h["leader_epoch"]) for h in (json.loads(raw)["headers"] for raw in raws)
    ]


def test_a_leader_killed_mid_burst_sends_no_slot_twice_and_loses_at_most_one_batch(
    redis_server: RedisServer, procs: Procs
) -> None:
    base = redis_server.url.rsplit("/", 1)[0]
    broker_url, store_url = f"{base}/4", f"{base}/5"
    broker = redis.Redis.from_url(broker_url)
    store = redis.Redis.from_url(store_url)
    broker.flushdb()
    store.flushdb()
    now = datetime.now(timezone.utc)
    due = EPOCH + (now - EPOCH) // PERIOD * PERIOD  # the latest grid point
    seed(store_url, due)
    expected = {slot_name(name, due) for name in names()}

    env = {
        "BROKER_URL": broker_url,
        "LEADER_URL": store_url,
        "LEADER_TTL": str(TTL),
        "BEAT_EVERY": str(PERIOD.total_seconds()),
        "BEAT_ENTRIES": str(N),
        "PYTHONPATH": os.pathsep.join(filter(None, [PYTHONPATH, str(REPO)])),
    }
    beat = ("-A", "tests.apps.beat_app", "beat", "-S", "leader", "-l", "warning")
    first = procs.spawn_python(CELERY, *beat, env={**env, "INSTANCE_ID": "first"})
    # Past a claim batch's first flushes: the kill falls inside a batch.
    mid = N // 4 + 3 * PIPELINE
    wait_for(lambda: broker.llen("celery") >= mid, 60, message="the burst never started")
    first.kill_group()
    killed_at = broker.llen("celery")
    started = time.monotonic()
    procs.spawn_python(CELERY, *beat, env={**env, "INSTANCE_ID": "second"})

    config = LeaderConfig.from_mapping({"leader_url": store_url, "leader_ttl": TTL})
    backend = open_store(config)

    def finished() -> tuple[dict[str, dict[str, object]], list[tuple[str, int]]] | None:
        """The stored states and the broker's messages, once every slot is claimed and
        every slot claimed by the second leader is in the broker."""
        states = {k: json.loads(v) for k, v in backend.records.load(config.beat_election).items()}
        if any(s.get("slot") not in expected for s in states.values()):
            return None
        sent = published(broker)
        epochs = {epoch for _, epoch in sent}
        in_broker = {slot for slot, _ in sent}
        last = max(epochs)
        if len(epochs) < 2 or any(
            s["epoch"] == last and s["slot"] not in in_broker for s in states.values()
        ):
            return None
        return states, sent

    try:
        states, sent = wait_for(finished, 75, interval=0.5, message="the burst never finished")
    finally:
        backend.close()
    took = time.monotonic() - started

    counts = Counter(slot for slot, _ in sent)
    twice = [slot for slot, n in counts.items() if n > 1]
    assert not twice, f"{len(twice)} slots sent twice, e.g. {twice[:3]}"
    assert set(counts) <= expected
    epochs = sorted({epoch for _, epoch in sent})
    assert len(epochs) == 2, f"slots sent under epochs {epochs}"
    killed_epoch, next_epoch = epochs
    lost = expected - set(counts)
    # Every slot missing from the broker was claimed by the killed leader, in the
    # one batch it was publishing when it died.
    assert all(states[slot.partition("@")[0]]["epoch"] == killed_epoch for slot in lost)
    assert len(lost) <= BATCH
    by_epoch = Counter(epoch for _, epoch in sent)
    print(
        f"\nburst of {N:,}: {killed_at:,} in the broker at the SIGKILL; the first leader "
        f"sent {by_epoch[killed_epoch]:,}, the second {by_epoch[next_epoch]:,} in "
        f"{took:.1f} s after the kill; {len(lost):,} claimed by the first and lost; 0 twice"
    )
