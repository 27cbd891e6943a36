"""The run ledger with real ``celery worker`` processes on a real Redis, and real
Dramatiq workers and schedulers on a Redis or a RabbitMQ broker (the store is Redis).

Messages carry ``leader_slot`` as beat sends them; the ``work`` task of
``tests/apps/ledger_app.py`` records every run of its body in Redis, and the
assertions are on those records and on the ledger in the store.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_leader.backends import StoreFacets, open_store
from celery_leader.ledger import RunRecord
from celery_leader.settings.config import LeaderConfig
from harness.metrics import scrape
from harness.procs import Proc, Procs
from harness.servers import free_port
from harness.waiting import wait_for
from tests.ledger_reads import record, slot_records

ROOT = Path(__file__).resolve().parents[1]
CELERY = Path(sys.executable).parent / "celery"
DRAMATIQ = Path(sys.executable).parent / "dramatiq"
APP = "tests.apps.ledger_app"
#: ``python -m celery_leader.dramatiq`` (the standalone Dramatiq scheduler), as code.
SCHEDULER = "import runpy; runpy.run_module('celery_leader.dramatiq', run_name='__main__')"
TTL = 2.0


class Workers:
    """Worker nodes of one test, the sender, the store and the records of runs."""

    def __init__(self, procs: Procs, url: str) -> None:
        self.procs = procs
        self.url = url
        self.redis = redis.Redis.from_url(url, decode_responses=True)
        self.store: StoreFacets = open_store(
            LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL})
        )
        self.sender = Celery("sender", broker=url)

    def start(self, name: str, **env: str) -> Proc:
        proc = self.procs.spawn_python(
            CELERY,
            *("-A", APP, "worker", "-P", "prefork", "-c", "2", "-n", f"{name}@%h", "-l", "INFO"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            env={"BROKER_URL": self.url, "LEADER_TTL": str(TTL), **env},
            cwd=ROOT,
        )
        proc.wait_for_line(r"ready\.", 60)
        return proc

    def send(self, slot: str, seconds: float = 0.0) -> None:
        self.sender.send_task(
            "tests.apps.ledger_app.work",
            args=[seconds],
            headers={"leader_slot": slot, "leader_epoch": 1},
        )

    def runs(self, slot: str) -> list[dict[str, Any]]:
        """Every record of a run of ``slot``'s body (starts and ends)."""
        lines = [json.loads(line) for line in self.redis.lrange("runs", 0, -1)]
        return [line for line in lines if line["slot"] == slot]

    def record(self, slot: str) -> RunRecord | None:
        text = record(self.store.runs, slot)
        return None if text is None else RunRecord.load(text, slot)

    def close(self) -> None:
        self.store.close()
        self.redis.close()


@pytest.fixture
def workers(procs: Procs, redis_url: str) -> Any:
    made = Workers(procs, redis_url)
    yield made
    made.close()


def _slot() -> str:
    return f"job-{uuid.uuid4().hex[:8]}@2026-01-01T00:00:00+00:00"


def test_a_slot_delivered_three_times_runs_once(workers: Workers) -> None:
    a = workers.start("a")
    b = workers.start("b")
    slot = _slot()
    for _ in range(3):
        workers.send(slot, 0.5)
    record = wait_for(
        lambda: (r := workers.record(slot)) is not None and r.status == "finished" and r,
        timeout=30,
    )
    wait_for(
        lambda: (a.output() + b.output()).count(f"slot {slot} not run") == 2,
        timeout=30,
        message="two deliveries acknowledged, not run",
    )
    starts = [r for r in workers.runs(slot) if "start" in r]
    assert len(starts) == 1, starts
    assert record.outcome == "success" and record.attempt == 1
    assert record.finished is not None and record.finished >= record.started


def test_a_worker_says_in_its_log_that_the_ledger_is_on(workers: Workers) -> None:
    """Logged once Celery has set up the worker's logging (not from worker_init,
    before it, where the line went nowhere)."""
    a = workers.start("a")
    # Logged before the banner, so it is in the output once the worker is ready:
    # the deadline only covers reading the pipe.
    a.wait_for_line(r"celery-leader: run ledger on \(\d+ task\(s\); a dead worker's slot: ", 10)
    assert a.output().count("celery-leader: run ledger on") == 1


def test_a_workers_metrics_count_what_its_pool_processes_did(workers: Workers) -> None:
    """The ledger counts in the prefork pool processes; the main process serves them."""
    port = free_port()
    workers.start("m", METRICS_PORT=str(port))
    slot = _slot()
    for _ in range(3):
        workers.send(slot, 0.2)

    def counted() -> dict[str, float] | None:
        samples = scrape(port)
        done = samples.get('celery_leader_ledger_duplicates_total{election="beat"}') == 2
        ran = samples.get('celery_leader_ledger_finished_total{election="beat"}') == 1
        return samples if done and ran else None

    samples = wait_for(counted, timeout=30, message="two duplicates and one finished run")
    assert samples['celery_leader_ledger_runs_total{election="beat"}'] == 1
    assert samples['celery_leader_ledger_running{election="beat"}'] == 0
    assert samples.get('celery_leader_ledger_failures_total{election="beat"}', 0) == 0
    assert len([r for r in workers.runs(slot) if "start" in r]) == 1


def test_messages_without_a_slot_run_as_before(workers: Workers) -> None:
    workers.start("a")
    for _ in range(2):
        workers.sender.send_task("tests.apps.ledger_app.work", args=[0])
    wait_for(lambda: workers.redis.llen("runs") == 4, timeout=30)
    assert slot_records(workers.store.runs) == {}


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["rerun", "skip"])
def test_a_worker_killed_mid_body(workers: Workers, policy: str) -> None:
    """acks_late: the broker redelivers; ``rerun`` runs it once more, ``skip`` does not."""
    a = workers.start("a", ON_REDELIVERY=policy)
    slot = _slot()
    workers.send(slot, 30)
    wait_for(lambda: workers.runs(slot), timeout=30, message="the body started on a")
    first = workers.record(slot)
    assert first is not None and first.status == "started" and first.attempt == 1
    a.signal(signal.SIGKILL)  # the whole process tree: main process and pool
    a.wait(10)
    b = workers.start("b", ON_REDELIVERY=policy)
    if policy == "rerun":
        wait_for(lambda: len(workers.runs(slot)) == 2, timeout=40, message="run again on b")
        record = workers.record(slot)
        assert record is not None and record.status == "started" and record.attempt == 2
        assert record.pid != first.pid
        b.wait_for_line(rf"slot {re.escape(slot)} runs again \(attempt 2\)", 10)
    else:
        b.wait_for_line(rf"slot {re.escape(slot)} not run: .* died running it", 40)
        record = workers.record(slot)
        assert record is not None and record.outcome == "skipped"
        assert len(workers.runs(slot)) == 1, "started once, never again"
    (shown,) = [e for e in _status(workers)["entries"] if e["last_slot"] == slot]
    if policy == "rerun":
        assert (shown["state"], shown["attempt"], shown["runs"]) == ("running", 2, 1)
    else:
        assert (shown["state"], shown["outcome"], shown["skips"]) == ("finished", "skipped", 1)


def _status(workers: Workers) -> dict[str, Any]:
    """``celery leader status --json``, as the app's user runs it."""
    out = subprocess.run(
        [str(CELERY), "-A", APP, "leader", "status", "--json"],
        env={**os.environ, "BROKER_URL": workers.url},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode in (0, 3), out.stderr
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


def _start_beat(workers: Workers, **env: str) -> Proc:
    return workers.procs.spawn_python(
        CELERY,
        *("-A", APP, "beat", "-S", "tests.apps.ledger_app:PausingScheduler", "-l", "INFO"),
        env={"BROKER_URL": workers.url, "LEADER_TTL": str(TTL), "BEAT_EVERY": "1", **env},
        cwd=ROOT,
    )


@pytest.mark.slow
@pytest.mark.parametrize("run", range(3))
def test_a_leader_killed_between_claim_and_publish(workers: Workers, run: int) -> None:
    """The next leader re-sends the claimed, unsent slot once: it runs exactly once."""
    workers.start("a")
    wait_for(
        lambda: record(workers.store.runs, "@ledger-workers") is not None,
        timeout=20,
        message="the worker registered in the ledger",
    )
    first = _start_beat(workers, PAUSE_AT="3")
    paused = first.wait_for_line(r"pausing before publishing slot (\S+)", 60)
    slot = paused[1]
    first.signal(signal.SIGKILL)
    first.wait(10)
    second = _start_beat(workers)
    second.wait_for_line(rf"re-sending slot {re.escape(slot)} ", 30)
    wait_for(
        lambda: (r := workers.record(slot)) is not None and r.status == "finished",
        timeout=30,
        message=f"slot {slot} ran",
    )
    # A few more slots from the new leader, then count.
    wait_for(lambda: len(_ran(workers)) >= 5, timeout=30)
    second.signal(signal.SIGTERM)
    second.wait(15)
    # What was sent before the SIGTERM ends before the count.
    wait_for(
        lambda: all(
            r.status == "finished"
            for k, v in slot_records(workers.store.runs).items()
            if (r := RunRecord.load(v, k)) is not None
        ),
        timeout=30,
        message="every sent slot ended",
    )
    ran = _ran(workers)
    sent = set(slot_records(workers.store.runs)) | {slot}
    print(
        f"\nLEDGER-CHAOS redis-sigkill due={len(sent)} "
        f"once={sum(ran.get(s) == 1 for s in sent)} lost={sum(s not in ran for s in sent)} "
        f"twice={sum(ran.get(s, 0) > 1 for s in sent)}"
    )
    assert ran[slot] == 1, "the claimed, unsent slot ran exactly once"
    assert all(n == 1 for n in ran.values()), {s: n for s, n in ran.items() if n != 1}


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["once", "all"])
def test_a_message_the_broker_lost_is_a_missed_slot(workers: Workers, policy: str) -> None:
    """A slot published and then lost by the broker (kombu's Redis transport loses a
    message taken by a worker killed at that moment) is never started, while the next
    slot of its entry is: the leader judges it missed, and the missed-slot policy
    decides. The default ``once`` logs it and sends it no more (the next slot ran);
    ``all`` sends it again, and it runs once."""
    workers.start("a")
    wait_for(
        lambda: record(workers.store.runs, "@ledger-workers") is not None,
        timeout=20,
        message="the worker registered in the ledger",
    )
    env = {} if policy == "once" else {"MISSED_SLOTS": policy}
    beat = _start_beat(workers, LOSE_AT="3", **env)
    slot = beat.wait_for_line(r"losing slot (\S+)", 60)[1]
    if policy == "once":
        beat.wait_for_line(rf"not sending slot {re.escape(slot)} again: it has not started", 30)
    else:
        beat.wait_for_line(rf"re-sending slot {re.escape(slot)} .*of its entry, sent after", 30)
        wait_for(
            lambda: (r := workers.record(slot)) is not None and r.status == "finished",
            timeout=30,
            message=f"slot {slot} ran",
        )
    wait_for(lambda: len(_ran(workers)) >= 10, timeout=30, message="ten slots ran")
    beat.signal(signal.SIGTERM)
    beat.wait(15)
    ran = _ran(workers)
    assert ran.get(slot, 0) == (0 if policy == "once" else 1), ran.get(slot)
    assert all(n == 1 for n in ran.values()), {s: n for s, n in ran.items() if n != 1}
    if policy == "once":
        assert (r := workers.record(slot)) is not None and r.status == "sent", r


@pytest.mark.slow
def test_by_default_beat_resends_nothing_to_workers_without_the_dedup_step(
    workers: Workers,
) -> None:
    """Beat with the default settings, workers with the ledger off: a leader killed
    between claim and publish loses that slot (as before the ledger), and no slot
    runs twice, since nobody would drop a second copy."""
    a = workers.start("a", LEDGER="0")
    first = _start_beat(workers, PAUSE_AT="3")
    slot = first.wait_for_line(r"pausing before publishing slot (\S+)", 60)[1]
    first.signal(signal.SIGKILL)
    first.wait(10)
    second = _start_beat(workers)
    second.wait_for_line(r"no worker with its dedup step has registered: nothing is re-sent", 30)
    wait_for(lambda: len(_ran(workers)) >= 5, timeout=30, message="five slots ran")
    second.signal(signal.SIGTERM)
    second.wait(15)
    ran = _ran(workers)
    assert slot not in ran, "lost, not re-sent: at most once"
    assert all(n == 1 for n in ran.values()), {s: n for s, n in ran.items() if n != 1}
    assert "re-sending slot" not in second.output()
    assert "run ledger on" not in a.output()
    assert record(workers.store.runs, "@ledger-workers") is None


def _ran(workers: Workers) -> dict[str, int]:
    """Slot -> runs of its body."""
    counts: dict[str, int] = {}
    for line in workers.redis.lrange("runs", 0, -1):
        record = json.loads(line)
        if "start" in record and record["slot"]:
            counts[record["slot"]] = counts.get(record["slot"], 0) + 1
    return counts


@pytest.mark.slow
def test_overlap_skip_runs_one_slot_of_an_entry_at_a_time(workers: Workers) -> None:
    """Every 1 s, a 2.5 s body, three nodes: runs never overlap; the rest are skipped."""
    nodes = [workers.start(name) for name in ("a", "b", "c")]
    beat = _start_beat(workers, OVERLAP="skip", WORK_SECONDS="2.5")
    wait_for(lambda: len(_intervals(workers)) >= 4, timeout=60, message="four runs ended")
    beat.signal(signal.SIGTERM)
    beat.wait(15)
    # Let what was sent finish (or be skipped).
    wait_for(
        lambda: all(
            r.status == "finished"
            for k, v in slot_records(workers.store.runs).items()
            if (r := RunRecord.load(v, k)) is not None
        ),
        timeout=30,
        message="every sent slot ended",
    )
    intervals = sorted(_intervals(workers).values())
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, f"two runs overlap: {intervals}"
    records = [
        r
        for k, v in slot_records(workers.store.runs).items()
        if (r := RunRecord.load(v, k)) is not None
    ]
    skipped = [r for r in records if r.outcome == "skipped"]
    ran = [r for r in records if r.outcome == "success"]
    assert len(ran) == len(intervals)
    assert skipped, "slots due while a run went on are skipped"
    assert all("still running" in (r.reason or "") for r in skipped)
    logs = "".join(node.output() for node in nodes)
    assert logs.count("not run: slot") == len(skipped)


def _intervals(workers: Workers) -> dict[str, tuple[float, float]]:
    """Slot -> (start, end) of each run of its body that ended."""
    starts: dict[str, float] = {}
    out: dict[str, tuple[float, float]] = {}
    for line in workers.redis.lrange("runs", 0, -1):
        record = json.loads(line)
        if "start" in record:
            starts[record["slot"]] = record["start"]
        elif record["slot"] in starts:
            out[record["slot"]] = (starts[record["slot"]], record["end"])
    return out


BROKERS = pytest.mark.parametrize(
    "broker", ["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]
)


@BROKERS
def test_dramatiq_a_slot_delivered_three_times_runs_once(
    procs: Procs, redis_url: str, broker: str, request: pytest.FixtureRequest
) -> None:
    broker_url = redis_url if broker == "redis" else request.getfixturevalue("amqp_url")
    env = {
        "BROKER_URL": broker_url,
        "STORE_URL": redis_url,
        "CELERY_LEADER_LEDGER": "1",
        "CELERY_LEADER_TTL": str(TTL),
    }
    worker = procs.spawn_python(
        DRAMATIQ, "tests.apps.ledger_dramatiq", "-p", "2", "-t", "2", env=env, cwd=ROOT
    )
    worker.wait_for_line(r"Worker process is ready|is ready for action", 60)
    sender = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tests.apps.ledger_dramatiq import broker, work\n"
            "for _ in range(3):\n"
            "    broker.enqueue(work.message_with_options(args=(0.5,), leader_slot='job@1'))\n",
        ],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert sender.returncode == 0, sender.stderr
    store = open_store(LeaderConfig.from_mapping({"leader_url": redis_url}))
    try:
        wait_for(
            lambda: (
                (t := record(store.runs, "job@1")) is not None
                and (r := RunRecord.load(t, "job@1")) is not None
                and r.status == "finished"
            ),
            timeout=30,
            message="the slot ran",
        )
        wait_for(lambda: worker.output().count("slot job@1 not run") == 2, timeout=30)
    finally:
        store.close()
    runs = [json.loads(line) for line in redis.Redis.from_url(redis_url).lrange("runs", 0, -1)]
    assert [r["slot"] for r in runs] == ["job@1"]


@pytest.mark.slow
@BROKERS
def test_dramatiq_a_scheduler_killed_between_claim_and_publish(
    procs: Procs, redis_url: str, broker: str, request: pytest.FixtureRequest
) -> None:
    """The same on Dramatiq, on either broker: the next scheduler re-sends the slot
    once; it runs once."""
    broker_url = redis_url if broker == "redis" else request.getfixturevalue("amqp_url")
    with _dramatiq_worker(procs, broker_url, redis_url) as (app, env, store):
        first = procs.spawn_python(SCHEDULER, app, env={**env, "PAUSE_AT": "3"}, cwd=ROOT)
        slot = first.wait_for_line(r"pausing before publishing slot (\S+)", 60)[1]
        first.signal(signal.SIGKILL)
        first.wait(10)
        second = procs.spawn_python(SCHEDULER, app, env=env, cwd=ROOT)
        second.wait_for_line(rf"re-sending slot {re.escape(slot)} ", 30)
        wait_for(
            lambda: (
                (t := record(store.runs, slot)) is not None
                and (r := RunRecord.load(t, slot)) is not None
                and r.status == "finished"
            ),
            timeout=30,
            message=f"slot {slot} ran",
        )
        wait_for(lambda: len(_dramatiq_runs(redis_url)) >= 5, timeout=30)
        second.signal(signal.SIGTERM)
        second.wait(15)
    runs = _dramatiq_runs(redis_url)
    assert runs[slot] == 1
    assert all(n == 1 for n in runs.values()), runs


@pytest.mark.slow
def test_dramatiq_a_message_the_broker_lost_is_sent_again_and_runs_once(
    procs: Procs, redis_url: str
) -> None:
    """The same on Dramatiq, under ``leader_missed_slots = "all"``: a slot enqueued and
    lost is sent again once a later slot has started, and runs once."""
    missed = {"CELERY_LEADER_MISSED_SLOTS": "all"}
    with _dramatiq_worker(procs, redis_url, redis_url, **missed) as (app, env, _):
        scheduler = procs.spawn_python(SCHEDULER, app, env={**env, "LOSE_AT": "3"}, cwd=ROOT)
        slot = scheduler.wait_for_line(r"losing slot (\S+)", 60)[1]
        scheduler.wait_for_line(rf"re-sending slot {re.escape(slot)} .*of its entry, sent", 30)
        wait_for(lambda: _dramatiq_runs(redis_url).get(slot) == 1, timeout=30, message="it ran")
        wait_for(lambda: len(_dramatiq_runs(redis_url)) >= 10, timeout=30)
        scheduler.signal(signal.SIGTERM)
        scheduler.wait(15)
    runs = _dramatiq_runs(redis_url)
    assert runs[slot] == 1
    assert all(n == 1 for n in runs.values()), runs


@contextmanager
def _dramatiq_worker(
    procs: Procs, broker_url: str, store_url: str, **settings: str
) -> Iterator[tuple[str, dict[str, str], StoreFacets]]:
    """A Dramatiq worker of the ledger app (its actor ``tick`` every second) registered in
    the ledger: the app, the environment its schedulers take, and the store."""
    env = {
        "BROKER_URL": broker_url,
        "STORE_URL": store_url,
        "CELERY_LEADER_LEDGER": "1",
        "CELERY_LEADER_TTL": str(TTL),
        "EVERY": "1",
        **settings,
    }
    app = "tests.apps.ledger_dramatiq"
    worker = procs.spawn_python(DRAMATIQ, app, "-p", "1", "-t", "2", env=env, cwd=ROOT)
    worker.wait_for_line(r"Worker process is ready|is ready for action", 60)
    store = open_store(LeaderConfig.from_mapping({"leader_url": store_url}))
    try:
        wait_for(lambda: record(store.runs, "@ledger-workers") is not None, timeout=20)
        yield app, env, store
    finally:
        store.close()


def _dramatiq_runs(url: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in redis.Redis.from_url(url).lrange("runs", 0, -1):
        slot = json.loads(line)["slot"]
        counts[slot] = counts.get(slot, 0) + 1
    return counts
