"""Real ``celery worker`` processes on a real Redis: who runs ``@leader_only`` tasks.

Every worker is a separate ``celery -A tests.apps.worker_app worker`` process
tree; tasks record who ran them in Redis (see ``tests/apps/worker_app.py``),
and the assertions are on those records, on the store, and on the clock.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_leader.backends import StoreFacets, open_store
from celery_leader.probes.health import check
from celery_leader.settings.config import LeaderConfig
from harness.metrics import scrape
from harness.procs import Proc, Procs
from harness.procs import signal as signal_proc
from harness.proxy import TcpProxy
from harness.servers import RabbitServer, free_port
from harness.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
CELERY = Path(sys.executable).parent / "celery"
TTL = 2.0
APP = "tests.apps.worker_app"
LEADER_QUEUE = "celery_leader.leader.worker"
N = 30
SENT = re.compile(r"celery-leader: sending slot (?P<slot>\S+) \(epoch (?P<epoch>\d+)\)")


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

    def __init__(self, procs: Procs, url: str, broker_url: str | None = None) -> None:
        self.procs = procs
        self.url = url
        #: The broker: the store's Redis, or RabbitMQ.
        self.broker_url = broker_url or url
        self.redis = redis.Redis.from_url(url, decode_responses=True)
        self.store: StoreFacets = open_store(
            LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL})
        )
        self.sender = Celery("sender", broker=self.broker_url)
        self.nodes: dict[str, Proc] = {}
        self.beats: dict[str, Proc] = {}

    def start(
        self,
        name: str,
        pool: str = "prefork",
        start_method: str = "fork",
        own_queue: bool = True,
        **env: str,
    ) -> Proc:
        """A worker node consuming ``celery`` and, with ``own_queue``, a queue of its name."""
        proc = self.procs.spawn_python(
            CELERY,
            *("-A", APP, "worker", "-P", pool, "-c", "2", "-n", f"{name}@%h", "-l", "INFO"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            *(("-Q", f"celery,{name}") if own_queue else ()),
            env={
                "BROKER_URL": self.broker_url,
                "STORE_URL": self.url,
                "LEADER_TTL": str(TTL),
                "POOL_START_METHOD": start_method,
                **env,
            },
            cwd=ROOT,
        )
        self.nodes[name] = proc
        return proc

    def start_beat(self, name: str, task: str, **env: str) -> Proc:
        """``celery beat -S leader`` sending ``task`` every second (``BEAT_EVERY``)."""
        proc = self.procs.spawn_python(
            CELERY,
            *("-A", APP, "beat", "-S", "leader", "-l", "INFO"),
            env={
                "BROKER_URL": self.broker_url,
                "STORE_URL": self.url,
                "LEADER_TTL": str(TTL),
                "BEAT_TASK": task,
                **env,
            },
            cwd=ROOT,
        )
        self.beats[name] = proc
        return proc

    def stop_beats(self) -> None:
        """SIGTERM every beat and wait for it to exit.

        Whenever it lands: beat holds a stop signal back while a claimed slot is
        being published, so no slot is lost to the stop.
        """
        for proc in self.beats.values():
            signal_proc(proc, signal.SIGTERM)
        for proc in self.beats.values():
            proc.wait(15)

    def sent_slots(self) -> dict[str, int]:
        """Slot -> epoch of every slot the beats sent, from their logs."""
        sent: dict[str, int] = {}
        for proc in self.beats.values():
            for match in SENT.finditer(proc.output()):
                assert match["slot"] not in sent, f"slot {match['slot']} sent twice"
                sent[match["slot"]] = int(match["epoch"])
        return sent

    def slot_runs(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.redis.lrange("slots", 0, -1)]

    def deliveries(self) -> list[str]:
        return self.redis.lrange("deliveries", 0, -1)

    def wait_slots_ran(self, slots: Iterable[str], timeout: float) -> None:
        wanted = set(slots)

        def missing() -> set[str]:
            return wanted - {run["slot"] for run in self.slot_runs()}

        wait_for(lambda: not missing(), timeout, 0.1, lambda: f"slots never ran: {missing()}")

    def wait_ready(self) -> None:
        for proc in self.nodes.values():
            proc.wait_for_line(r"\bready\.", 60)

    def holder(self, election: str = "worker") -> str | None:
        """Node name (without @host) that the store says leads ``election``."""
        info = self.store.lock.holder(election)
        return None if info is None else info.instance_id.partition("@")[0]

    def wait_leader(self, timeout: float = 10) -> str:
        return wait_for(self.holder, timeout, message="a node leads 'worker'")

    def send(self, task: str, tags: list[str], **options: object) -> dict[str, str]:
        """Send ``task`` once per tag; returns tag -> task id."""
        return {
            tag: self.sender.send_task(f"{APP}.{task}", args=(tag,), **options).id  # type: ignore[arg-type]
            for tag in tags
        }

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

    # Wait mode, sent by name from a process without the task (so into the
    # ordinary queue): a follower forwards what it gets to the leader queue.
    tags = [f"wait-{i}" for i in range(N)]
    cluster.send("wait_task", tags)
    cluster.wait_done(tags, {"SUCCESS"}, timeout=30)
    assert {t: cluster.ran(t) for t in tags} == {t: [leader] for t in tags}
    for tag in tags:
        assert set(cluster.done(tag)) <= {("SUCCESS", leader), ("RETRY", survivor)}

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


@pytest.mark.timing  # the pool stops believing before the ttl: less than 0.67 s to spare
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
    [
        # A warm shutdown's bound is half a second.
        pytest.param(signal.SIGTERM, "warm", 0.5, marks=pytest.mark.timing, id="warm"),
        pytest.param(signal.SIGQUIT, "cold", 5.0, id="cold"),
    ],
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
def test_a_killed_leader_node_s_tasks_resume_on_the_next_within_a_second(
    cluster: Cluster,
) -> None:
    """At the default ttl: the dead node's presence on Redis ends with its connections."""
    cluster.start("nodeA", LEADER_TTL="15")
    cluster.start("nodeB", LEADER_TTL="15")
    cluster.wait_ready()
    leader = cluster.wait_leader()
    survivor = "nodeB" if leader == "nodeA" else "nodeA"
    tags = [f"before-{i}" for i in range(5)]
    cluster.send("wait_task", tags)
    cluster.wait_done(tags, {"SUCCESS"}, timeout=30)

    killed_at = time.monotonic()
    cluster.nodes[leader].kill_group()
    tags = [f"after-{i}" for i in range(N)]
    cluster.send("wait_task", tags)
    cluster.wait_done(tags, {"SUCCESS"}, timeout=30)
    assert {t: cluster.ran(t) for t in tags} == {t: [survivor] for t in tags}
    resumed = cluster.first_run(tags) - killed_at
    print(f"MEASURED worker SIGKILL at ttl 15 s: first task on the next node after {resumed:.2f} s")
    assert resumed <= 1.0, f"first task ran {resumed:.2f} s after the kill"


@pytest.mark.slow
def test_fencing_drops_tasks_of_a_deposed_scheduler(cluster: Cluster) -> None:
    # Two terms of the beat election: the second one's epoch is current.
    first = cluster.store.lock.acquire("beat", "scheduler", TTL * 10, 0).term
    assert first is not None
    cluster.store.lock.release("beat", first)
    second = cluster.store.lock.acquire("beat", "scheduler", TTL * 10, first.epoch).term
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


# -- @leader_only with default settings: beat's slots reach the leader ---------

BEAT_POOLS = [
    pytest.param("prefork", "fork", 30, id="prefork-fork"),
    pytest.param("prefork", "spawn", 15, id="prefork-spawn"),
    pytest.param("threads", "fork", 15, id="threads"),
    pytest.param("solo", "fork", 15, id="solo"),
]


def _due(slot: str) -> float:
    """Wall-clock due time of ``entry@ISO-8601`` as a timestamp."""
    return datetime.fromisoformat(slot.partition("@")[2]).timestamp()


@pytest.mark.slow
@pytest.mark.parametrize(("pool", "start_method", "seconds"), BEAT_POOLS)
def test_every_beat_slot_runs_once_on_the_leader(
    cluster: Cluster, pool: str, start_method: str, seconds: int
) -> None:
    cluster.start("nodeA", pool, start_method)
    cluster.start("nodeB", pool, start_method)
    cluster.wait_ready()
    leader = cluster.wait_leader()
    cluster.start_beat("beat", "slot_task")
    wait_for(cluster.sent_slots, 30, message="beat sends")
    time.sleep(seconds)  # the run being measured: beat sends once a second meanwhile
    cluster.stop_beats()
    sent = cluster.sent_slots()
    assert len(sent) >= seconds, f"beat sent {len(sent)} slots in {seconds} s"
    cluster.wait_slots_ran(sent, 10)
    runs = cluster.slot_runs()
    assert sorted(run["slot"] for run in runs) == sorted(sent), "a slot ran twice"
    assert {run["node"].partition("@")[0] for run in runs} == {leader}
    # Steady state: every message went straight to the leader, nothing bounced.
    print(
        f"MEASURED {pool}/{start_method}: {len(runs)} of {len(sent)} slots ran once, "
        f"{len(cluster.deliveries()) - len(sent)} extra deliveries"
    )
    assert len(cluster.deliveries()) == len(sent)
    # Only the leader ever consumed the leader queue.
    other = "nodeB" if leader == "nodeA" else "nodeA"
    assert "consumes celery_leader.leader.worker" in cluster.nodes[leader].output()
    assert "consumes celery_leader.leader.worker" not in cluster.nodes[other].output()


@pytest.mark.slow
def test_slots_due_while_the_leader_is_killed_run_late_on_the_next_one(cluster: Cluster) -> None:
    cluster.start("nodeA")
    cluster.start("nodeB")
    cluster.wait_ready()
    leader = cluster.wait_leader()
    survivor = "nodeB" if leader == "nodeA" else "nodeA"
    cluster.start_beat("beat", "slot_task")
    wait_for(lambda: len(cluster.sent_slots()) >= 3, 30, message="beat sends")
    # Kill between two slots, not while the leader runs one: once the next slot ran,
    # half-way to the one after (a point on beat's grid, so a wait for the clock).
    last = max(_due(slot) for slot in cluster.sent_slots())
    wait_for(
        lambda: any(_due(run["slot"]) > last for run in cluster.slot_runs()),
        10,
        message="the next slot never ran",
    )
    time.sleep(max(0.0, last + 1.5 - time.time()))
    killed_at = time.time()
    cluster.nodes[leader].kill_group()
    # Through the hand-over and past it: a slot due TTL + 3 s after the kill ran.
    wait_for(
        lambda: any(_due(run["slot"]) >= killed_at + TTL + 3 for run in cluster.slot_runs()),
        TTL + 15,
        message="no slot due after the hand-over ran",
    )
    cluster.stop_beats()
    sent = cluster.sent_slots()
    cluster.wait_slots_ran(sent, 10)
    runs = cluster.slot_runs()
    assert sorted(run["slot"] for run in runs) == sorted(sent), "a slot ran twice"
    during = [run for run in runs if _due(run["slot"]) > killed_at]
    assert len(during) >= TTL + 3
    assert {run["node"].partition("@")[0] for run in during} == {survivor}
    late = max(run["at"] - _due(run["slot"]) for run in during)
    print(
        f"MEASURED kill: {len(runs)} of {len(sent)} slots ran once; {len(during)} due after "
        f"the kill ran on the survivor, at most {late:.2f} s late (ttl {TTL:g} s)"
    )
    assert late <= TTL + 1, f"a slot due during the hand-over ran {late:.2f} s late"


@pytest.mark.slow
def test_fencing_keeps_retries_across_a_graceful_beat_handover(cluster: Cluster) -> None:
    for name in ("nodeA", "nodeB"):
        cluster.start(name, FENCE="1")
    cluster.wait_ready()
    cluster.wait_leader()
    for name in ("beat1", "beat2"):
        cluster.start_beat(name, "retry_once_task")
    wait_for(lambda: len(cluster.sent_slots()) >= 3, 30, message="beat sends")
    before = cluster.store.lock.holder("beat")
    assert before is not None
    cluster.store.lock.request_resign("beat")  # what `celery leader resign` does
    wait_for(
        lambda: (h := cluster.store.lock.holder("beat")) is not None and h.epoch > before.epoch,
        10,
        message="beat handed over",
    )
    handed_over_at = time.time()
    wait_for(
        lambda: sum(e > before.epoch for e in cluster.sent_slots().values()) >= 3,
        15,
        message="the new beat leader sent fewer than 3 slots",
    )
    cluster.stop_beats()
    sent = cluster.sent_slots()
    assert len(set(sent.values())) == 2, f"one epoch only: {sent}"
    cluster.wait_slots_ran(sent, 15)
    runs = cluster.slot_runs()
    assert sorted(run["slot"] for run in runs) == sorted(sent), "a slot ran twice"
    # The case that matters: retries of the old epoch ran after the new one began.
    assert any(run["epoch"] == before.epoch and run["at"] > handed_over_at for run in runs), runs
    for proc in cluster.nodes.values():
        assert "dropped task" not in proc.output()
    crossed = sum(run["epoch"] == before.epoch and run["at"] > handed_over_at for run in runs)
    print(
        f"MEASURED fence: {len(runs)} of {len(sent)} slots ran once, {crossed} retried "
        "across the hand-over"
    )


def _cpu_seconds(proc: Proc) -> float:
    """User + system CPU time of every process in ``proc``'s process group."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == proc.pid:  # pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_reject_backs_off_while_nobody_leads(cluster: Cluster) -> None:
    # Someone else holds the election for the whole run: to these nodes,
    # nobody leads.
    rival = cluster.store.lock.acquire("worker", "rival", 60, 0).term
    assert rival is not None
    cluster.start("nodeA")
    cluster.start("nodeB")
    cluster.wait_ready()
    tags = ["r1", "r2"]
    cluster.send("reject_task", tags)
    wait_for(cluster.deliveries, 10, message="first delivery")
    cpu = sum(_cpu_seconds(p) for p in cluster.nodes.values())
    time.sleep(20)  # the measurement window: redeliveries and CPU while nobody leads
    cpu = sum(_cpu_seconds(p) for p in cluster.nodes.values()) - cpu
    deliveries = len(cluster.deliveries())
    print(f"MEASURED reject, nobody leads for 20 s: {deliveries} deliveries, {cpu / 20:.1%} CPU")
    assert deliveries < 50, f"{deliveries} deliveries in 20 s"
    assert cpu / 20 < 0.10, f"{cpu / 20:.1%} of a core"
    assert all(cluster.ran(tag) == [] for tag in tags)
    cluster.store.lock.release("worker", rival)
    cluster.wait_done(tags, {"SUCCESS"}, timeout=20)
    assert all(len(cluster.ran(tag)) == 1 for tag in tags)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ((), {"LEADER_TTL": "-1"}, "leader_ttl must be a number of seconds greater than 0"),
        (("-Q", "celery,celery_leader.leader.worker"), {}, "the leader queue of election"),
        ((), {"QUEUES": "broadcast"}, "as a Broadcast queue"),
        ((), {"QUEUES": "only-leader"}, "would consume nothing but leader queues"),
    ],
    ids=["bad-ttl", "leader-queue-in-Q", "broadcast-leader-queue", "only-leader-queues"],
)
def test_a_worker_with_bad_settings_fails_in_one_line(
    procs: Procs, redis_url: str, argv: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    proc = procs.spawn_python(
        CELERY,
        *("-A", APP, "worker", "-P", "solo", "--without-gossip", "--without-mingle", *argv),
        env={"BROKER_URL": redis_url, **env},
        cwd=ROOT,
    )
    assert proc.wait(60) == 1
    # Celery's own warning about running as root may come first; then ours, alone.
    output = proc.output()
    assert "Traceback" not in output, output
    # Our lines start with "celery-leader:"; a path in Celery's warning may hold the
    # name too (a checkout in a folder named after the project).
    ours = [line for line in proc.lines() if line.startswith("celery-leader:")]
    assert len(ours) == 1, output
    assert ours[0].startswith("celery-leader: cannot start worker ")
    assert message in ours[0]
    assert proc.lines()[-1] == ours[0]


_DELAY = """
import sys
from tests.apps.worker_app import wait_task
for tag in sys.argv[1:]:
    wait_task.delay(tag)
"""


@pytest.mark.slow
def test_delay_from_a_plain_process_goes_straight_to_the_leader(cluster: Cluster) -> None:
    # No -Q: the nodes consume every queue the app knows, except leader queues.
    cluster.start("nodeA", own_queue=False)
    cluster.start("nodeB", own_queue=False)
    cluster.wait_ready()
    leader = cluster.wait_leader()
    tags = [f"d{i}" for i in range(10)]
    # A process that imports the task module and calls delay(): its app is
    # never finalized, and the message still goes to the leader queue.
    sender = cluster.procs.spawn_python(_DELAY, *tags, env={"BROKER_URL": cluster.url}, cwd=ROOT)
    assert sender.wait(30) == 0, sender.output()
    cluster.wait_done(tags, {"SUCCESS"}, timeout=20)
    assert {t: cluster.ran(t) for t in tags} == {t: [leader] for t in tags}
    assert len(cluster.deliveries()) == len(tags)  # none went through a follower


@pytest.mark.slow
def test_messages_prefetched_by_a_demoted_leader_run_on_the_next_one(cluster: Cluster) -> None:
    cluster.start("nodeA")
    cluster.start("nodeB")
    cluster.wait_ready()
    leader = cluster.wait_leader()
    other = "nodeB" if leader == "nodeA" else "nodeA"
    # Both pool processes of the leader busy until the hand-over is over: what it
    # fetches meanwhile waits in its hands, however long the hand-over takes. (With
    # 3 s sleeps instead, a slow hand-over let the leader run them itself.)
    busy = ["busy1", "busy2"]
    cluster.send("latched_task", busy, queue=leader)
    for tag in busy:
        started = f"started:{tag}"
        wait_for(lambda: cluster.redis.llen(started) == 1, 10, message=started)
    ids = cluster.send("wait_task", [f"held-{i}" for i in range(4)], queue=LEADER_QUEUE)

    def received() -> set[str]:
        """The tags whose messages the leader's node took, by task id (not any line
        that names the task, which the precondition used to count)."""
        log = cluster.nodes[leader].output()
        return {tag for tag, task_id in ids.items() if f"wait_task[{task_id}] received" in log}

    # One prefetched message per pool process (worker_prefetch_multiplier = 1).
    wait_for(lambda: len(received()) >= 2, 10, message="the leader holding two messages")
    cluster.store.lock.request_resign("worker")
    wait_for(lambda: cluster.holder() == other, 10, message="the other node leads")
    wait_for(
        lambda: f"stops consuming {LEADER_QUEUE}" in cluster.nodes[leader].output(),
        10,
        message="the demoted node no longer consuming the leader queue",
    )
    held = received()  # it takes nothing from the leader queue any more
    for tag in busy:
        cluster.redis.rpush(f"release:{tag}", "go")
    cluster.wait_done(list(ids), {"SUCCESS"}, timeout=20)
    # Nothing lost, nothing run on the demoted node: what it held went back to
    # the leader queue when its turn came, and ran once, on the new leader.
    assert {t: cluster.ran(t) for t in ids} == {t: [other] for t in ids}
    forwarded = {t for t in ids if ("RETRY", leader) in cluster.done(t)}
    assert forwarded == held, f"held {sorted(held)}, forwarded {sorted(forwarded)}"


@pytest.mark.slow
def test_worker_health_file_and_metrics_follow_the_role(cluster: Cluster, tmp_path: Path) -> None:
    """The worker's main process serves `leader check`, /healthz and Prometheus, like beat."""
    ports = {name: free_port() for name in ("nodeA", "nodeB")}
    health_ports = {name: free_port() for name in ports}
    files = {name: tmp_path / f"{name}.json" for name in ports}
    for name in ports:
        cluster.start(
            name,
            HEALTH_FILE=str(files[name]),
            METRICS_PORT=str(ports[name]),
            HEALTH_PORT=str(health_ports[name]),
        )
    cluster.wait_ready()
    leader = cluster.wait_leader()
    other = "nodeB" if leader == "nodeA" else "nodeA"
    gauge = 'celery_leader_is_leader{election="worker"}'

    def healthy(name: str, role: str) -> str | None:
        ok, line = check(files[name])
        return line if ok and line.startswith(f"OK: {role} of 'worker'") else None

    wait_for(lambda: healthy(leader, "leader"), 5, message="leader's health file")
    wait_for(lambda: healthy(other, "follower"), 5, message="follower's health file")
    assert scrape(ports[leader])[gauge] == 1.0
    assert scrape(ports[other])[gauge] == 0.0
    for name in ports:  # leader and follower pass the endpoint's /healthz too
        with urllib.request.urlopen(f"http://127.0.0.1:{health_ports[name]}/healthz") as reply:
            assert reply.status == 200 and reply.read().startswith(b"OK: ")

    killed_at = time.monotonic()
    cluster.nodes[leader].kill_group()
    wait_for(lambda: healthy(other, "leader"), TTL + 2, message="new leader's health file")
    took = time.monotonic() - killed_at
    after = scrape(ports[other])
    assert after[gauge] == 1.0
    assert after['celery_leader_elections_total{election="worker"}'] == 1.0
    # The dead node's file is no longer refreshed: its probe fails once it is stale.
    wait_for(lambda: not check(files[leader], max_age=1.0)[0], 5, message="stale file")
    print(f"MEASURED worker health: new leader's file said so {took:.2f} s after SIGKILL")


# -- RabbitMQ: the leader queue declared like the user's queues (issue 19) ------------


@pytest.fixture
def rabbit_cluster(procs: Procs, redis_url: str, amqp_url: str) -> Iterator[Cluster]:
    """Workers and beat on RabbitMQ; the lease store and the records on Redis."""
    cluster = Cluster(procs, redis_url, amqp_url)
    yield cluster
    cluster.store.close()


_COUNTDOWN = """
import sys
from tests.apps.worker_app import wait_task
wait_task.apply_async((sys.argv[1],), countdown=2)
"""


@pytest.mark.slow
@pytest.mark.rabbitmq
@pytest.mark.parametrize("queues", ["quorum", "no-missing", "explicit", "renamed"])
def test_on_rabbitmq_every_beat_slot_runs_once_across_a_sigkill_of_the_leader(
    rabbit_cluster: Cluster, queues: str
) -> None:
    cluster = rabbit_cluster
    cluster.start("nodeA", own_queue=False, QUEUES=queues)
    cluster.start("nodeB", own_queue=False, QUEUES=queues)
    cluster.wait_ready()
    leader = cluster.wait_leader()
    survivor = "nodeB" if leader == "nodeA" else "nodeA"
    cluster.start_beat("beat", "slot_task", QUEUES=queues)
    wait_for(lambda: len(cluster.sent_slots()) >= 3, 30, message="beat sends")
    if queues == "quorum":
        # Native delayed delivery: a countdown goes through celery_delayed_*, which
        # must route it on to the (bound) leader queue.
        subprocess.run(
            [sys.executable, "-c", _COUNTDOWN, "countdown-1"],
            env={
                **os.environ,
                "BROKER_URL": cluster.broker_url,
                "STORE_URL": cluster.url,
                "QUEUES": queues,
                "PYTHONPATH": str(ROOT),
            },
            cwd=ROOT,
            check=True,
            timeout=60,
        )
        cluster.wait_done(["countdown-1"], {"SUCCESS"}, timeout=20)
        assert cluster.ran("countdown-1") == [leader]
    last = max(_due(slot) for slot in cluster.sent_slots())
    time.sleep(max(0.0, last + 1.5 - time.time()))
    killed_at = time.time()
    cluster.nodes[leader].kill_group()
    time.sleep(TTL + 4)
    cluster.stop_beats()
    sent = cluster.sent_slots()
    cluster.wait_slots_ran(sent, 15)
    runs = cluster.slot_runs()
    assert sorted(run["slot"] for run in runs) == sorted(sent), "a slot ran twice"
    before = {run["node"].partition("@")[0] for run in runs if _due(run["slot"]) < killed_at}
    during = [run for run in runs if _due(run["slot"]) > killed_at]
    assert before == {leader}
    assert len(during) >= TTL + 3
    assert {run["node"].partition("@")[0] for run in during} == {survivor}
    for proc in cluster.nodes.values():
        assert "PreconditionFailed" not in proc.output()
        assert "Error in timer" not in proc.output()
        assert "Failed to bind" not in proc.output()  # native delayed delivery
    print(f"MEASURED rabbitmq/{queues}: {len(runs)} of {len(sent)} slots ran once across a kill")


@pytest.mark.slow
@pytest.mark.rabbitmq
def test_a_leader_cut_off_from_rabbitmq_hands_the_leader_queue_over(
    procs: Procs,
    redis_url: str,
    amqp_url: str,
    rabbitmq_server: RabbitServer,
    tcp_proxy: Callable[[str, int], TcpProxy],
) -> None:
    # Issue 19: the store stays reachable, so the lease alone would keep the cut-off
    # node leading while the leader queue fills. Its consumer being down for a ttl
    # makes it step down; the other node consumes the leader queue.
    cut_for = 20.0
    proxies = {name: tcp_proxy("127.0.0.1", rabbitmq_server.port) for name in ("nodeA", "nodeB")}
    cluster = Cluster(procs, redis_url, amqp_url)
    try:
        for name, proxy in proxies.items():
            cluster.start(name, own_queue=False, BROKER_URL=proxy.url_for(amqp_url))
        cluster.wait_ready()
        leader = cluster.wait_leader()
        survivor = "nodeB" if leader == "nodeA" else "nodeA"
        cluster.start_beat("beat", "slot_task")
        wait_for(lambda: len(cluster.slot_runs()) >= 3, 30, message="slots run")
        proxy = proxies[leader]
        # Connections are reset and new ones hang: the consumer reconnects in vain.
        proxy.hold()
        proxy.cut()
        cut_at = time.time()
        time.sleep(cut_for)
        proxy.release()
        time.sleep(3)
        cluster.stop_beats()
        sent = cluster.sent_slots()
        cluster.wait_slots_ran(sent, 15)
        runs = cluster.slot_runs()
        assert sorted(run["slot"] for run in runs) == sorted(sent), "a slot ran twice"
        after = [run for run in runs if _due(run["slot"]) > cut_at]
        first = min(run["at"] for run in after if run["node"].startswith(survivor))
        late = max(run["at"] - _due(run["slot"]) for run in after)
        print(
            f"MEASURED rabbitmq consumer cut {cut_for:g} s (ttl {TTL:g} s): the other node ran "
            f"the leader queue {first - cut_at:.2f} s after the cut; {len(after)} slots due "
            f"after it ran once, at most {late:.2f} s late"
        )
        assert first - cut_at <= TTL + 5
        assert "broker consumer has not reached the broker" in cluster.nodes[leader].output()
    finally:
        cluster.store.close()
