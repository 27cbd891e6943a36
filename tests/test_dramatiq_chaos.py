"""Chaos: three replicas of a real Dramatiq app share one scheduler, through real faults.

Each replica runs tests/apps/dramatiq_app.py, either embedded (``dramatiq -p 2`` with
``LeaderMiddleware(scheduler=True)``: two worker processes and the scheduler fork) or
standalone (``python -m celery_leader.dramatiq``). The broker is a Redis server of its
own, so the lease store (Redis, PostgreSQL, a directory or a three-member etcd cluster)
can be restarted while the
sent messages stay. Nobody consumes the ``ticks`` queue but a tap in this test, which
takes each message off as it lands (polling every 5 ms) and notes when: duplicates are
counted by ``leader_slot`` from the broker, and a gap is the longest silence between
two arrivals around a fault (the due time in ``leader_slot`` would hide it, since a
new leader sends a missed slot under its original time).

The matrix stays lean for CI: every fault on Redis with embedded schedulers; the crash
and graceful faults standalone on Redis; on PostgreSQL and file, the faults whose
bound differs from Redis (the crashes, which their stores detect at once) and a
graceful one; on etcd, the replica faults and those of the cluster itself (its Raft
leader killed, quorum lost and back). Run with ``-s`` to see the measured gaps.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path

import pytest
import redis

from celery_leader.backends import Fence, Write, open_store
from celery_leader.exceptions import StoreUnavailable
from celery_leader.schedule.state import dump_state
from celery_leader.settings.config import LeaderConfig
from harness.dramatiq_tap import DramatiqTap
from harness.etcd import EtcdCluster
from harness.groups import group_cpu_seconds, pgrp_of
from harness.procs import Proc, Procs
from harness.proxy import TcpProxy
from harness.servers import MariaDbServer, PostgresServer, RedisServer
from harness.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timing]

DRAMATIQ = Path(sys.executable).with_name("dramatiq")
REPO = Path(__file__).resolve().parents[1]
APP = "tests.apps.dramatiq_app"
TTL = 3.0
EVERY = 0.2
#: Longest silence around a fault: the hand-over plus up to one period, because the
#: fault may strike just before a slot, which then waits for the new leader.
GRACEFUL = 0.5 + EVERY
#: A graceful hand-over on etcd is three Raft commits in a row (revoke, acquire,
#: claim), each a majority's round trip among members that share two busy cores
#: with the suite: up to 0.1 s each there (0.73 s in all once, 0.08-0.39 s alone).
ETCD_COMMITS = 3 * 0.1
#: etcd looks for expired leases every 0.5 s: it frees a lease up to that long
#: after its ttl (Redis expires a key to the millisecond).
ETCD_EXPIRY = 0.5
#: Every store but etcd sees a dead holder's connection or lock go (Redis: its
#: presence); etcd frees the lease after the ttl and its expiry loop. Then the
#: take-over (0.5 s) and up to one period.
CRASH = {"redis": 0.5 + EVERY, "postgres": 0.5 + EVERY, "mariadb": 0.5 + EVERY,
         "file": 0.5 + EVERY, "etcd": TTL + ETCD_EXPIRY + 0.5 + EVERY}  # fmt: skip
#: A paused holder keeps its connection open: its term runs out after the ttl
#: (on etcd, after the expiry loop too).
PAUSE = {"redis": TTL + 0.5 + EVERY, "postgres": TTL + 0.5 + EVERY,
         "mariadb": TTL + 0.5 + EVERY, "file": TTL + 0.5 + EVERY,
         "etcd": TTL + ETCD_EXPIRY + 0.5 + EVERY}  # fmt: skip
#: Quorum back: etcd's new Raft leader restarts every lease's TTL plus one election
#: timeout (1 s) before the old holder's lease can run out, and its expiry loop runs
#: every 0.5 s; then a follower takes over as after a crash.
QUORUM_BACK = TTL + 1.0 + 0.5 + 0.5
#: A replica's exit after SIGTERM to its main process only (Dramatiq 2.2's cli.py and
#: worker.py, and this test's ttl, whose store timeout is 1 s), at worst: each worker
#: process sees the signal at its next 1 s poll; its ``before_worker_shutdown`` waits for
#: the release (the lease thread joined within a store timeout + 1 s, then the release
#: call within a store timeout: 3 s); its worker threads leave their 1 s work-queue poll,
#: then its consumers their 1 s broker poll; the main process's log watcher polls its
#: stop event every 1 s. That is 7 s of sleeps and timeouts (2.0-3.5 s measured on an
#: idle machine); the rest is for the CPU the exiting processes need under the suite's
#: load. Before the gate stopped rather than paused a stopping leader's consumer,
#: Dramatiq's 3 s consumer restart delay came on top, and one exit took over 10 s.
TERM_EXIT = 1.0 + 3.0 + 1.0 + 1.0 + 1.0 + 3.0
READY = r"Dramatiq scheduler \S+ joins 'beat'"
HOST = socket.gethostname()


@dataclass(frozen=True)
class Sent:
    seen: float  # time.monotonic() when the tap took it off the broker
    slot: str
    epoch: int


class Tap:
    """The sent slots, as the broker received them (see harness.dramatiq_tap)."""

    def __init__(self, client: redis.Redis) -> None:
        self._tap = DramatiqTap(client)

    def sent(self) -> list[Sent]:
        return [
            Sent(a.seen, a.options["leader_slot"], a.options["leader_epoch"])
            for a in self._tap.arrivals()
        ]

    def close(self) -> None:
        self._tap.close()


class Replicas:
    """Three replicas; the test replaces those a fault ends."""

    def __init__(self, procs: Procs, env: dict[str, str], embedded: bool) -> None:
        self.procs = procs
        # The tap counts duplicates at the broker, and embedded replicas run workers
        # with the run ledger's dedup step: with it on (the default), a fault between
        # a claim and its "sent" mark is re-sent (at least once, by design). These
        # tests are about hand-over and at-most-once scheduling: the ledger is off.
        self.env = {
            **env,
            "EMBEDDED": "1" if embedded else "0",
            "PYTHONPATH": str(REPO),
            "CELERY_LEADER_LEDGER": "0",
        }
        self.embedded = embedded
        self.places: list[Proc] = []

    def spawn(self, **extra: str) -> Proc:
        env = {**self.env, **extra}
        if self.embedded:
            proc = self.procs.spawn_python(
                DRAMATIQ, APP, "-p", "2", "-t", "1", "--queues", "waiting", env=env, cwd=REPO
            )
        else:
            proc = self.procs.spawn_python(
                "import sys; from celery_leader.dramatiq.runner import standalone; "
                f"sys.exit(standalone([{APP!r}]))",
                env=env,
                cwd=REPO,
            )
        proc.wait_for_line(READY, 60)
        return proc

    def start(self) -> None:
        self.places = [self.spawn() for _ in range(3)]

    def replace(self, proc: Proc) -> None:
        """``proc`` killed and a new replica in its place, once it has started up.

        Its worker processes go on importing after it joins: the next fault's
        hand-over, timed to 0.7 s, must not share the CPU with that (a graceful
        hand-over on etcd took 0.73 s right after a replacement, 0.08 s alone).
        """
        proc.kill_group()
        new = self.places[self.places.index(proc)] = self.spawn()
        last = [group_cpu_seconds(new.pid), time.monotonic()]

        def quiet() -> bool:  # under a tenth of a core over the last half second
            cpu, now = group_cpu_seconds(new.pid), time.monotonic()
            if now - last[1] < 0.5:
                return False
            used, last[:] = (cpu - last[0]) / (now - last[1]), [cpu, now]
            return used < 0.1

        wait_for(quiet, 30, interval=0.1, message="the new replica never settled")


def leader_pid(config: LeaderConfig, timeout: float) -> int:
    """Pid of the process that holds the beat election, asked of the store."""
    backend = open_store(config)

    def ask() -> int | None:
        try:
            holder = backend.lock.holder(config.beat_election)
        except StoreUnavailable:
            return None
        if holder is None or not holder.instance_id.startswith(f"{HOST}:"):
            return None
        return int(holder.instance_id.rpartition(":")[2])

    try:
        return wait_for(ask, timeout, interval=0.05, message="a leader in the store")
    finally:
        backend.close()


def replica_of(replicas: Replicas, pid: int) -> Proc:
    group = pgrp_of(pid)
    return next(p for p in replicas.places if p.pid == group)


def steady(tap: Tap, count: int = 5) -> None:
    start = len(tap.sent())
    wait_for(lambda: len(tap.sent()) >= start + count, 20, message="slots arriving")


def gap_around(tap: Tap, fault: float, old_epoch: int, timeout: float) -> float:
    """Silence from the old term's last arrival to the new term's first one."""
    wait_for(
        lambda: any(s.epoch > old_epoch and s.seen > fault for s in tap.sent()),
        timeout,
        message="a new term sending",
    )
    sent = tap.sent()
    last_old = max(s.seen for s in sent if s.epoch == old_epoch)
    first_new = min(s.seen for s in sent if s.epoch > old_epoch)
    return first_new - last_old


def check_slots(sent: list[Sent]) -> None:
    twice = [slot for slot, n in Counter(s.slot for s in sent).items() if n > 1]
    assert not twice, f"slots sent twice: {twice[:10]}"
    epochs = [s.epoch for s in sent]
    assert epochs == sorted(epochs), "epochs went back"


Fault = Callable[[Replicas, Proc, int], None]


def kill_group(replicas: Replicas, replica: Proc, pid: int) -> None:
    os.killpg(replica.pid, signal.SIGKILL)


def kill_fork(replicas: Replicas, replica: Proc, pid: int) -> None:
    assert pid != replica.pid, "the scheduler should run in a fork"
    os.kill(pid, signal.SIGKILL)


def term_main(replicas: Replicas, replica: Proc, pid: int) -> None:
    # Through the harness: a replica still running at teardown was asked to stop,
    # so its stacks are written to its log (SIGABRT) before it is killed.
    replica.signal(signal.SIGTERM, group=False)


def kill_main(replicas: Replicas, replica: Proc, pid: int) -> None:
    """SIGKILL of ``dramatiq``'s main process alone: its scheduler fork must notice."""
    os.kill(replica.pid, signal.SIGKILL)
    wait_for(lambda: not running(pid), 1.0, message="the orphaned scheduler fork exiting")


def running(pid: int) -> bool:
    """True while ``pid`` exists and is no zombie (who reaps orphans depends on PID 1)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def term_group(replicas: Replicas, replica: Proc, pid: int) -> None:
    replica.signal(signal.SIGTERM)  # the whole group, through the harness (see term_main)


CRASHES = {"kill_group", "kill_fork"}


@pytest.fixture(scope="module")
def broker_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def tap(broker_server: RedisServer) -> Iterator[Tap]:
    with broker_server.client() as client:
        client.flushall()
    client = broker_server.client()
    tap = Tap(client)
    yield tap
    tap.close()
    client.close()


def silence_after(tap: Tap, since: float, count: int = 10) -> float:
    """Longest silence between arrivals from the last one before ``since`` to ``count`` after."""
    wait_for(lambda: len([s for s in tap.sent() if s.seen > since]) >= count, 20, message="slots")
    seen = [s.seen for s in tap.sent()]
    window = [t for t in seen if t <= since][-1:] + [t for t in seen if t > since][:count]
    return max(b - a for a, b in pairwise(window))


@pytest.fixture(params=["redis", "postgres", "mariadb", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, object]:
    kind = request.param
    if kind in ("redis", "postgres", "mariadb"):
        server: object = request.getfixturevalue(f"{kind}_server")
        url = request.getfixturevalue(f"{kind}_url")
    else:
        server, url = None, f"file://{tmp_path}/leases"
        (tmp_path / "leases").mkdir()
    return kind, url, server


def run_faults(
    procs: Procs,
    tap: Tap,
    broker_server: RedisServer,
    store: tuple[str, str, object],
    embedded: bool,
    faults: list[str],
) -> None:
    kind, url, server = store
    env = {"BROKER_URL": broker_server.url, "LEADER_URL": url, "LEADER_TTL": str(TTL)}
    config = LeaderConfig.from_env(env={}, leader_url=url, leader_ttl=TTL)
    replicas = Replicas(procs, env, embedded)
    replicas.start()
    steady(tap)
    rows = []
    for name in faults:
        pid = leader_pid(config, PAUSE[kind] + 5)
        replica = replica_of(replicas, pid)
        steady(tap, 3)
        old_epoch = tap.sent()[-1].epoch
        fault = time.monotonic()
        if name == "stop_cont":
            os.killpg(replica.pid, signal.SIGSTOP)
            gap = gap_around(tap, fault, old_epoch, PAUSE[kind] + 10)
            wait_for(lambda: time.monotonic() > fault + 1.5 * TTL, 2 * TTL)
            os.killpg(replica.pid, signal.SIGCONT)
            resumed = time.monotonic()
            steady(tap, 10)  # two seconds in which the resumed ex-leader could send
            late = [s for s in tap.sent() if s.seen > resumed and s.epoch <= old_epoch]
            assert not late, f"the resumed ex-leader sent {late}"
            bound = PAUSE[kind]
        elif name == "raft_leader_kill":
            # The others elect a Raft leader and carry every lease over: the holder
            # may keep its term; what counts is how long nothing was sent.
            assert isinstance(server, EtcdCluster)
            member = server.raft_leader()
            member.kill()
            gap = silence_after(tap, fault)
            member.start()
            bound = CRASH[kind]
        elif name == "quorum_loss":
            assert isinstance(server, EtcdCluster)
            server.lose_quorum()
            time.sleep(TTL + 1.0)  # the fault's length: the test's choice
            # Nothing may be sent until a member is relaunched; quorum is back once
            # the first one serves, maybe well before the last one does.
            relaunched = time.monotonic()
            back = server.regain_quorum()
            stray = [s for s in tap.sent() if fault + TTL < s.seen < relaunched]
            assert not stray, f"sent without quorum: {stray}"
            wait_for(lambda: any(s.seen > back for s in tap.sent()), QUORUM_BACK + 10)
            gap = min(s.seen for s in tap.sent() if s.seen > back) - back
            bound = QUORUM_BACK
        elif name == "store_restart":
            assert isinstance(server, RedisServer | PostgresServer | MariaDbServer)
            server.stop()
            server.start()
            gap = gap_around(tap, fault, old_epoch, 4 * TTL + 10)
            bound = 4 * TTL + 5  # the leader's term runs out, the store comes back empty
        else:
            {
                "kill_group": kill_group,
                "kill_fork": kill_fork,
                "kill_main": kill_main,
                "term_main": term_main,
                "term_group": term_group,
            }[name](replicas, replica, pid)
            gap = gap_around(tap, fault, old_epoch, CRASH["redis"] + 10)
            bound = (
                CRASH[kind]
                if name in CRASHES
                else GRACEFUL + (ETCD_COMMITS if kind == "etcd" else 0.0)
            )
            if name == "kill_fork" and replica.alive:
                replicas.replace(replica)
            elif name != "kill_fork":
                if name not in ("kill_group", "kill_main"):
                    replica.wait(TERM_EXIT)
                replicas.replace(replica)
        rows.append((name, gap, bound))
        print(f"{kind} {'embedded' if embedded else 'standalone'} {name}: gap {gap:.3f} s")
        assert gap <= bound, f"{name}: {gap:.3f} s without a slot (bound {bound:.2f} s)"
        check_slots(tap.sent())
    check_slots(tap.sent())
    print(f"{len(tap.sent())} slots, 0 sent twice; gaps {rows}")


def test_every_fault_on_redis_embedded(
    procs: Procs, tap: Tap, broker_server: RedisServer, redis_server: RedisServer, redis_url: str
) -> None:
    run_faults(
        procs,
        tap,
        broker_server,
        ("redis", redis_url, redis_server),
        True,
        [
            "kill_group",
            "kill_fork",
            "kill_main",
            "term_main",
            "term_group",
            "stop_cont",
            "store_restart",
        ],
    )


def test_faults_on_redis_standalone(
    procs: Procs, tap: Tap, broker_server: RedisServer, redis_server: RedisServer, redis_url: str
) -> None:
    run_faults(
        procs,
        tap,
        broker_server,
        ("redis", redis_url, redis_server),
        False,
        ["kill_group", "term_group", "stop_cont"],
    )


def test_faults_on_etcd_embedded(
    procs: Procs,
    tap: Tap,
    broker_server: RedisServer,
    etcd_cluster: EtcdCluster,
    etcd_url: str,
) -> None:
    run_faults(
        procs,
        tap,
        broker_server,
        ("etcd", etcd_url, etcd_cluster),
        True,
        ["kill_group", "term_group", "stop_cont", "raft_leader_kill", "quorum_loss"],
    )


@pytest.mark.parametrize(
    "store",
    ["postgres", pytest.param("mariadb", marks=pytest.mark.mariadb), "file"],
    indirect=True,
)
def test_crashes_are_detected_at_once_on_postgres_mariadb_and_file(
    procs: Procs, tap: Tap, broker_server: RedisServer, store: tuple[str, str, object]
) -> None:
    faults = ["kill_group", "kill_fork", "term_main"]
    if store[0] == "mariadb":
        # MariaDB's pause and restart are covered nowhere else for Dramatiq; PostgreSQL's
        # are in the beat chaos test, which shares the store code with Dramatiq.
        faults += ["stop_cont", "store_restart"]
    run_faults(procs, tap, broker_server, store, True, faults)


@pytest.mark.slow
@pytest.mark.parametrize("embedded", [False, True], ids=["standalone", "embedded"])
def test_a_scheduler_cut_off_from_its_broker_hands_over_and_sends_nothing_twice(
    procs: Procs,
    tap: Tap,
    broker_server: RedisServer,
    redis_url: str,
    tcp_proxy: Callable[[str, int], TcpProxy],
    embedded: bool,
) -> None:
    # Each replica reaches the broker through its own proxy; the leader's is held for
    # 15 s (bytes stop, nothing is closed). Its enqueue hangs, the tick watchdog (the
    # ttl) ends its term, another replica takes over; the one enqueue in flight at the
    # cut lands when the link heals, and nothing else of the old term does.
    partition = 15.0
    proxies = [tcp_proxy("127.0.0.1", broker_server.port) for _ in range(3)]
    env = {"LEADER_URL": redis_url, "LEADER_TTL": str(TTL)}
    config = LeaderConfig.from_env(env={}, leader_url=redis_url, leader_ttl=TTL)
    replicas = Replicas(procs, env, embedded)
    replicas.places = [replicas.spawn(BROKER_URL=p.url_for(broker_server.url)) for p in proxies]
    steady(tap)
    place = replicas.places.index(replica_of(replicas, leader_pid(config, CRASH["redis"] + 5)))
    steady(tap, 3)
    old_epoch = tap.sent()[-1].epoch
    fault = time.monotonic()
    proxies[place].hold()
    gap = gap_around(tap, fault, old_epoch, TTL + 10)
    handover = min(s.seen for s in tap.sent() if s.epoch > old_epoch) - fault
    wait_for(lambda: time.monotonic() > fault + partition, partition + 1)
    proxies[place].release()
    healed = time.monotonic()
    new = len([s for s in tap.sent() if s.epoch > old_epoch])
    wait_for(lambda: len([s for s in tap.sent() if s.epoch > old_epoch]) >= new + 10, 10,
             message="the new leader stopped sending")  # fmt: skip
    # Anything of the old term seen a second after the cut was sent after it.
    late = [s for s in tap.sent() if s.epoch == old_epoch and s.seen > fault + 1.0]
    print(
        f"\n{'embedded' if embedded else 'standalone'} scheduler, broker held {partition:g} s, "
        f"ttl {TTL:g} s: another replica enqueued after {handover:.2f} s (gap {gap:.2f} s); "
        f"{len(late)} enqueue(s) of the old term landed late; {len(tap.sent())} slots, "
        "0 sent twice"
    )
    assert handover <= TTL + 2.5, f"hand-over took {handover:.2f} s"
    assert len(late) <= 1 and all(s.seen >= healed - 0.1 for s in late), late
    # The late one arrives after newer terms' slots; everything else is in epoch order.
    check_slots([s for s in tap.sent() if s not in late])
    slots = Counter(s.slot for s in tap.sent())
    assert max(slots.values()) == 1, [slot for slot, n in slots.items() if n > 1]


def test_a_stored_state_a_day_ahead_is_repaired_and_the_entry_keeps_firing(
    procs: Procs, tap: Tap, broker_server: RedisServer, redis_url: str
) -> None:
    # A replica whose clock ran a day ahead left the state of "tick" there: far more
    # than clock skew explains, so the next leader starts the entry anew from now.
    config = LeaderConfig.from_env(env={}, leader_url=redis_url, leader_ttl=TTL)
    backend = open_store(config)
    term = backend.lock.acquire(config.beat_election, "fast-replica", TTL, 0).term
    assert term is not None
    ahead = datetime.now(timezone.utc) + timedelta(days=1)
    raw = dump_state(ahead, 5, term.epoch, "fast-replica")
    assert backend.records.claim(Fence(config.beat_election, term), [Write("tick", None, raw)]) == [
        True
    ]
    backend.lock.release(config.beat_election, term)
    backend.close()
    env = {"BROKER_URL": broker_server.url, "LEADER_URL": redis_url, "LEADER_TTL": str(TTL)}
    replica = Replicas(procs, env, embedded=False).spawn()
    steady(tap, 3)
    warnings = [line for line in replica.lines() if "in the future" in line]
    assert len(warnings) == 1 and "'tick'" in warnings[0] and "[WARNING]" in warnings[0]
    check_slots(tap.sent())
