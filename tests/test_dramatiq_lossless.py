"""Wait-mode (and default) leader-only actors lose nothing, on RabbitMQ and on Redis.

Three replicas of tests/apps/dramatiq_app.py, two worker processes each, 200
messages to a leader-only actor, through a fault. Every message must run exactly
once, by a process that led when it started (the body records the epoch of its
term; one pid per epoch). Each case runs once per broker; the actor alternates
between explicit ``leader_on_follower="wait"`` and default options, so both run on
both brokers. Prefetch 4 with one worker thread: a demoted process holds messages
it must give back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker

from celery_leader.backends import open_store
from celery_leader.settings.config import LeaderConfig
from harness.groups import pgrp_of
from harness.procs import Proc, Procs
from harness.proxy import TcpProxy
from harness.servers import RedisServer
from harness.waiting import wait_for
from tests.apps.quorum import QuorumBroker
from tests.test_dramatiq_actors import records, worker_leader
from tests.test_dramatiq_chaos import APP, DRAMATIQ, HOST, REPO

pytestmark = [pytest.mark.slow, pytest.mark.timing]

COUNT = 200


@pytest.fixture(params=["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def broker_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "rabbitmq":
        yield request.getfixturevalue("amqp_url")
        return
    with RedisServer() as server:
        yield server.url


def make_broker(url: str, quorum: bool = False) -> dramatiq.Broker:
    if url.startswith("amqp"):
        # Confirmed publishes: an unconfirmed one is not known to be queued when
        # the sender closes its connection (a CI run on quorum queues missed 4).
        return (QuorumBroker if quorum else RabbitmqBroker)(url=url, confirm_delivery=True)
    return RedisBroker(url=url)


def send(url: str, actor: str, count: int, delay: int | None = None, quorum: bool = False) -> None:
    broker = make_broker(url, quorum)
    broker.declare_queue(actor)
    for n in range(count):
        broker.enqueue(dramatiq.Message(actor, actor, (n,), {}, {}), delay=delay)
    broker.close()


def start_replicas(procs: Procs, env: dict[str, str], queue: str) -> list[Proc]:
    replicas = [
        procs.spawn_python(
            DRAMATIQ, APP, "-p", "2", "-t", "1", "--queues", queue, env=env, cwd=REPO
        )
        for _ in range(3)
    ]
    for proc in replicas:
        wait_for(lambda p=proc: p.output().count("ready for action") >= 2, 90, message="boot")
    return replicas


def check(record: Path, actor: str) -> list[tuple[str, int, int, int | None]]:
    rows = [row for row in records(record) if row[0] == actor]
    counts = Counter(n for _, n, _, _ in rows)
    assert sorted(counts) == list(range(COUNT)), f"never ran: {set(range(COUNT)) - set(counts)}"
    twice = [n for n, c in counts.items() if c > 1]
    assert not twice, f"ran twice: {twice}"
    assert all(epoch is not None for *_, epoch in rows), "a body ran without leading"
    by_epoch: dict[int | None, set[int]] = {}
    for _, _, pid, epoch in rows:
        by_epoch.setdefault(epoch, set()).add(pid)
    assert all(len(pids) == 1 for pids in by_epoch.values()), by_epoch
    return rows


def missing(record: Path, actor: str) -> list[int]:
    ran = {n for a, n, _, _ in records(record) if a == actor}
    return sorted(set(range(COUNT)) - ran)


def all_ran(record: Path, actor: str) -> bool:
    return not missing(record, actor)


CASES = [
    ("queued", "plain"),
    ("resign", "waiting"),
    ("sigterm", "plain"),
    ("sigkill", "waiting"),
    ("delayed", "plain"),
]


@pytest.mark.parametrize(("fault", "actor"), CASES, ids=[f"{f}-{a}" for f, a in CASES])
def test_every_message_runs_once_on_a_leader(
    procs: Procs, broker_url: str, redis_url: str, tmp_path: Path, fault: str, actor: str
) -> None:
    run_case(procs, broker_url, redis_url, tmp_path, fault, actor)


@pytest.mark.rabbitmq
def test_quorum_queues_lose_nothing_across_a_sigkill(
    procs: Procs, amqp_url: str, redis_url: str, tmp_path: Path
) -> None:
    """RabbitMQ quorum queues (``x-queue-type: quorum``, declared by a broker subclass)."""
    run_case(procs, amqp_url, redis_url, tmp_path, "sigkill", "waiting", quorum=True)


def run_case(
    procs: Procs,
    broker_url: str,
    redis_url: str,
    tmp_path: Path,
    fault: str,
    actor: str,
    quorum: bool = False,
) -> None:
    record = tmp_path / "record"
    env = {
        "BROKER_URL": broker_url,
        "LEADER_URL": redis_url,
        "LEADER_TTL": "3",
        "RECORD": str(record),
        "PYTHONPATH": str(REPO),
        "QUORUM": "1" if quorum else "0",
        "dramatiq_queue_prefetch": "4",
        # A SIGKILL must land in the middle of a body: one that landed between the
        # body's end and its ack would be run again by any broker (at-least-once).
        "BODY_SECONDS": "0.06" if fault == "sigkill" else "0.02",
    }
    if fault == "queued":
        send(broker_url, actor, COUNT, quorum=quorum)
    replicas = start_replicas(procs, env, actor)
    first = worker_leader(redis_url)
    group = pgrp_of(first)  # the leader's replica
    started = time.monotonic()
    if fault == "delayed":
        send(broker_url, actor, COUNT, delay=2000, quorum=quorum)
        # The leader dies while every replica holds delayed messages for later.
        time.sleep(0.5)
        os.killpg(group, signal.SIGKILL)
    elif fault != "queued":
        send(broker_url, actor, COUNT, quorum=quorum)
        wait_for(lambda: len(records(record)) >= 30, 30, interval=0.002, message="30 run")
        if fault == "resign":
            subprocess.run(
                [sys.executable, "-m", "celery_leader", "resign", "worker"],
                env={**os.environ, "CELERY_LEADER_URL": redis_url},
                check=True,
                timeout=30,
                capture_output=True,
            )
        elif fault == "sigterm":
            os.kill(group, signal.SIGTERM)  # the replica's dramatiq main process
        else:
            time.sleep(0.03)  # half-way through the next body
            os.killpg(group, signal.SIGKILL)
    wait_for(
        lambda: all_ran(record, actor),
        90,
        message=lambda: f"all {COUNT} run; never ran so far: {missing(record, actor)}",
    )
    took = time.monotonic() - started
    time.sleep(1.0)  # a late duplicate would land now
    rows = check(record, actor)
    pids = Counter(pid for _, _, pid, _ in rows)
    print(f"{fault}/{actor}: {COUNT} run once in {took:.1f} s by {dict(pids)}")
    if fault == "delayed":
        assert first not in pids, "the leader ran a message before it was due"
    elif fault != "queued":
        assert first in pids and len(pids) >= 2, "the fault handed nothing over"
    assert all(p.alive for p in replicas if p.pid != group)


@pytest.mark.rabbitmq
def test_a_worker_cut_off_from_rabbitmq_steps_down(
    procs: Procs,
    amqp_url: str,
    redis_url: str,
    tmp_path: Path,
    tcp_proxy: Callable[[str, int], TcpProxy],
) -> None:
    """Issue 19: the leading replica reaches RabbitMQ through a proxy that goes silent
    (its connections closed, new ones never answered). Its lease store is fine, but it
    cannot consume: it steps down, and a replica that can takes the messages."""
    record = tmp_path / "record"
    env = {
        "LEADER_URL": redis_url,
        "LEADER_TTL": "3",
        "RECORD": str(record),
        "PYTHONPATH": str(REPO),
    }
    parts = urlsplit(amqp_url)
    proxy = tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 5672)
    cut_off = procs.spawn_python(
        DRAMATIQ, APP, "-p", "1", "-t", "1", "--queues", "waiting",
        env={**env, "BROKER_URL": proxy.url_for(amqp_url)}, cwd=REPO,
    )  # fmt: skip
    cut_off.wait_for_line("consuming queue 'waiting'", 90)
    others = start_replicas(procs, {**env, "BROKER_URL": amqp_url}, "waiting")
    first = worker_leader(redis_url)
    assert pgrp_of(first) == cut_off.pid
    proxy.hold()
    proxy.cut()
    fault = time.monotonic()
    send(amqp_url, "waiting", 50)
    config = LeaderConfig.from_env(env={}, leader_url=redis_url, leader_ttl=3)
    backend = open_store(config)
    try:

        def other_holder() -> bool:
            holder = backend.lock.holder("worker")
            return holder is not None and holder.instance_id != f"{HOST}:{first}"

        wait_for(other_holder, 20, interval=0.05, message="another replica leading")
    finally:
        backend.close()
    took = time.monotonic() - fault
    wait_for(lambda: len(records(record)) >= 50, 30, message="all 50 run")
    rows = records(record)
    assert sorted(n for _, n, _, _ in rows) == list(range(50)), rows
    assert first not in {pid for _, _, pid, _ in rows}
    assert "has not reached the broker" in cut_off.output(), cut_off.output()
    print(f"cut-off leader replaced {took:.1f} s after the cut")
    # Dramatiq's restart delay (3 s) + two idle polls (2 s) + the renew interval (1 s).
    assert took < 3 + 2 + 1 + 1.0, took
    assert all(p.alive for p in others)
