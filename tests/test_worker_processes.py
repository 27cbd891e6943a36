"""Real ``celery worker`` processes on a real Redis: who runs ``@leader_only`` tasks.

Every worker is a separate ``celery -A tests.apps.worker_app worker`` process
tree; tasks record who ran them in Redis (see ``tests/apps/worker_app.py``),
and the assertions are on those records, on the store, and on the clock.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_leader.backends import create_backend
from celery_leader.backends.base import Backend
from celery_leader.config import LeaderConfig
from harness.procs import Proc, Procs
from harness.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
CELERY = Path(sys.executable).parent / "celery"
TTL = 2.0
APP = "tests.apps.worker_app"
N = 30


def _green(pool: str) -> object:
    # Not dependencies of the project: run where installed, say so where not.
    missing = importlib.util.find_spec(pool) is None
    return pytest.param(
        pool, "fork", id=pool, marks=pytest.mark.skipif(missing, reason=f"{pool} not installed")
    )


POOLS = [
    pytest.param("prefork", "fork", id="prefork-fork"),
    pytest.param("prefork", "spawn", id="prefork-spawn"),
    pytest.param("threads", "fork", id="threads"),
    pytest.param("solo", "fork", id="solo"),
    _green("gevent"),
    _green("eventlet"),
]


class Cluster:
    """Worker nodes of one test, the store they elect through, and the records."""

    def __init__(self, procs: Procs, url: str) -> None:
        self.procs = procs
        self.url = url
        self.redis = redis.Redis.from_url(url, decode_responses=True)
        self.store: Backend = create_backend(
            LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL})
        )
        self.sender = Celery("sender", broker=url)
        self.nodes: dict[str, Proc] = {}

    def start(
        self, name: str, pool: str = "prefork", start_method: str = "fork", **env: str
    ) -> Proc:
        proc = self.procs.spawn_python(
            CELERY,
            *("-A", APP, "worker", "-P", pool, "-c", "2", "-n", f"{name}@%h", "-l", "INFO"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            *("-Q", f"celery,{name}"),
            env={
                "BROKER_URL": self.url,
                "LEADER_TTL": str(TTL),
                "POOL_START_METHOD": start_method,
                **env,
            },
            cwd=ROOT,
        )
        self.nodes[name] = proc
        return proc

    def wait_ready(self) -> None:
        for proc in self.nodes.values():
            proc.wait_for_line(r"\bready\.", 60)

    def holder(self, election: str = "worker") -> str | None:
        """Node name (without @host) that the store says leads ``election``."""
        info = self.store.holder(election)
        return None if info is None else info.instance_id.partition("@")[0]

    def wait_leader(self, timeout: float = 10) -> str:
        return wait_for(self.holder, timeout, message="a node leads 'worker'")

    def send(self, task: str, tags: list[str], **options: object) -> None:
        for tag in tags:
            self.sender.send_task(f"{APP}.{task}", args=(tag,), **options)  # type: ignore[arg-type]

    def ran(self, tag: str) -> list[str]:
        return [n.partition("@")[0] for n in self.redis.lrange(f"ran:{tag}", 0, -1)]

    def done(self, tag: str) -> list[tuple[str, str]]:
        entries = self.redis.lrange(f"done:{tag}", 0, -1)
        return [(state, node.partition("@")[0]) for state, node in (e.split() for e in entries)]

    def wait_done(self, tags: list[str], final: set[str], timeout: float) -> None:
        """Until every tag had an attempt that ended in one of the ``final`` states."""

        def pending() -> list[str]:
            return [t for t in tags if not any(s in final for s, _ in self.done(t))]

        wait_for(
            lambda: not pending(),
            timeout,
            interval=0.05,
            message=lambda: f"tasks not finished: {pending()}",
        )

    def first_run(self, tags: list[str]) -> float:
        wanted = set(tags)
        times = [
            float(t)
            for tag, _, t in (e.split() for e in self.redis.lrange("runs", 0, -1))
            if tag in wanted
        ]
        return min(times)


@pytest.fixture
def cluster(procs: Procs, redis_url: str) -> Iterator[Cluster]:
    cluster = Cluster(procs, redis_url)
    yield cluster
    cluster.store.close()


@pytest.mark.slow
@pytest.mark.parametrize(("pool", "start_method"), POOLS)
def test_only_the_leader_runs_and_a_crash_hands_over(
    cluster: Cluster, pool: str, start_method: str
) -> None:
    cluster.start("nodeA", pool, start_method)
    cluster.start("nodeB", pool, start_method)
    cluster.wait_ready()
    leader = cluster.wait_leader()
    survivor = "nodeB" if leader == "nodeA" else "nodeA"

    # Skip mode: whatever ran, ran on the leader; the follower ignored the rest.
    tags = [f"skip-{i}" for i in range(N)]
    cluster.send("skip_task", tags)
    cluster.wait_done(tags, {"SUCCESS", "IGNORED"}, timeout=30)
    ran = {t: cluster.ran(t) for t in tags}
    assert all(len(nodes) <= 1 for nodes in ran.values()), ran
    assert {n for nodes in ran.values() for n in nodes} == {leader}
    for tag in tags:
        for state, node in cluster.done(tag):
            assert (state, node) in (("SUCCESS", leader), ("IGNORED", survivor))

    # Retry mode: every task runs, once, on the leader.
    tags = [f"retry-{i}" for i in range(N)]
    cluster.send("retry_task", tags)
    cluster.wait_done(tags, {"SUCCESS"}, timeout=60)
    assert {t: cluster.ran(t) for t in tags} == {t: [leader] for t in tags}

    # The leader crashes: the survivor takes over within the ttl and runs them all.
    killed_at = time.monotonic()
    cluster.nodes[leader].kill_group()
    tags = [f"after-{i}" for i in range(N)]
    cluster.send("retry_task", tags)
    cluster.wait_done(tags, {"SUCCESS"}, timeout=60)
    assert {t: cluster.ran(t) for t in tags} == {t: [survivor] for t in tags}
    assert cluster.holder() == survivor
    handover = cluster.first_run(tags) - killed_at
    assert handover <= TTL + 1, f"first task ran {handover:.2f} s after the kill"
    # Every pool process read its node's table; none joined the election itself.
    assert "from this process" not in cluster.nodes[survivor].output()


def _samples(cluster: Cluster, tag: str) -> list[tuple[float, bool]]:
    return [tuple(json.loads(s)) for s in cluster.redis.lrange(f"probe:{tag}", 0, -1)]  # type: ignore[misc]


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_pool_processes_stop_believing_when_the_main_process_stalls(
    cluster: Cluster, start_method: str
) -> None:
    node = cluster.start("nodeA", "prefork", start_method)
    cluster.wait_ready()
    cluster.wait_leader()
    cluster.sender.send_task(f"{APP}.probe", args=("p", TTL + 4))
    wait_for(lambda: any(leads for _, leads in _samples(cluster, "p")), 10, message="probe")

    stopped_at = time.monotonic()
    os.kill(node.pid, signal.SIGSTOP)  # the main process only: the child keeps running
    try:
        wait_for(
            lambda: _samples(cluster, "p")[-1][0] > stopped_at + TTL + 0.5,
            TTL + 10,
            message="probe samples past the ttl",
        )
    finally:
        os.kill(node.pid, signal.SIGCONT)
    after = [(t, leads) for t, leads in _samples(cluster, "p") if t >= stopped_at]
    # A deadline, not a flag: the child believed on for a while with nobody telling it...
    assert after[0][1], "the child stopped believing the moment the main process stopped"
    # ...and stopped by the main process's own deadline, which ends before the ttl
    # runs out (another node may then be elected: the child must not overlap it).
    late = [(t - stopped_at, leads) for t, leads in after if t >= stopped_at + TTL]
    assert late
    assert not any(leads for _, leads in late), late
    gave_up = min(t for t, leads in after if not leads) - stopped_at
    assert gave_up < TTL


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "how", "within"),
    [(signal.SIGTERM, "warm", 0.5), (signal.SIGQUIT, "cold", 5.0)],
    ids=["warm", "cold"],
)
def test_shutdown_releases_so_another_node_takes_over_at_once(
    cluster: Cluster, sig: signal.Signals, how: str, within: float
) -> None:
    # A long ttl: a handover much sooner than it proves the term was released.
    ttl = "15"
    cluster.start("nodeA", LEADER_TTL=ttl)
    cluster.start("nodeB", LEADER_TTL=ttl)
    cluster.wait_ready()
    leader = cluster.wait_leader()
    other = "nodeB" if leader == "nodeA" else "nodeA"
    # Keep the leader busy: a warm shutdown waits for this task, the election does not.
    cluster.send("sleep_task", ["busy"], kwargs={"seconds": 3}, queue=leader)
    wait_for(lambda: cluster.redis.lrange("started:busy", 0, -1), 10, message="busy")

    asked_at = time.monotonic()
    os.kill(cluster.nodes[leader].pid, sig)
    wait_for(lambda: cluster.holder() == other, 10, interval=0.005, message="handover")
    took = time.monotonic() - asked_at
    # Warm: the shutdown signal itself triggers the release. Cold: Celery first
    # cancels the running tasks in its signal handler, then lets us release.
    assert took < within, f"{how} shutdown handed over after {took:.2f} s"
    cluster.nodes[leader].wait_for_line(r"no longer leads 'worker' \(epoch \d+\): stopping", 5)
    if how == "warm":
        assert cluster.nodes[leader].alive, "the handover waited for the drain"
        # The drain goes on after the handover: the running task completes.
        # (Not waiting for the exit: billiard may hold a pool process up to
        # 30 s after a warm shutdown, waiting for its last result to be read.)
        wait_for(lambda: cluster.ran("busy") == [leader], 10, message="drained")


@pytest.mark.slow
def test_fencing_drops_tasks_of_a_deposed_scheduler(cluster: Cluster) -> None:
    # Two terms of the beat election: the second one's epoch is current.
    first = cluster.store.acquire("beat", "scheduler", TTL * 10, 0).tenure
    assert first is not None
    cluster.store.release("beat", first)
    second = cluster.store.acquire("beat", "scheduler", TTL * 10, first.epoch).tenure
    assert second is not None
    assert second.epoch > first.epoch
    node = cluster.start("nodeA", FENCE="1")
    cluster.wait_ready()

    stale, current, unfenced = (f"{kind}-{uuid.uuid4().hex[:6]}" for kind in "scu")
    cluster.send("plain_task", [stale], headers={"leader_epoch": first.epoch})
    cluster.send("plain_task", [current], headers={"leader_epoch": second.epoch})
    cluster.send("plain_task", [unfenced])
    cluster.wait_done([current, unfenced], {"SUCCESS"}, timeout=20)
    assert cluster.ran(stale) == []
    node.wait_for_line(
        rf"dropped task tests\.apps\.worker_app\.plain_task\[.*beat epoch {first.epoch}\b", 5
    )
