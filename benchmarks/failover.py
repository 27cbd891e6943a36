"""Hand-over, duplicates and survivors: three beat replicas per system, one fault at a time.

Every system runs the same Celery app (``benchmarks/apps/bench_app.py``) with one
entry due every ``PERIOD`` seconds, as three real ``celery beat`` processes (for
single-beat: three ``single-beat celery beat`` wrappers, of which one runs its
child). A thread here pops every published message off the broker's Redis list
and stamps its arrival, so gaps are measured where a worker would see them.

Each replica reaches its lock store through a TCP proxy of its own (one per etcd
member), so a partition cuts one replica off from the store while it still
reaches the broker: the split that lets a stale leader keep publishing.

Faults, applied to whichever replica is publishing at the time:

* ``graceful``: SIGTERM to the beat (single-beat: to the wrapper, as ``docker stop`` does)
* ``sigkill``: SIGKILL to its process group
* ``sigstop``: SIGSTOP for ``PAUSE`` seconds (past the ttl), then SIGCONT
* ``partition``: its store proxy holds all traffic for ``PARTITION`` seconds
* ``store-restart``: the lock store itself is stopped and started again (after the
  other faults, once per system unless ``--restarts`` says more; for etcd, all three
  members at once, keeping their data)

``python -m benchmarks.failover [--quick] [--reps N] [--restarts N] [SYSTEM ...]`` runs
this benchmark alone (for the named systems, e.g. ``leader-etcd``) and prints its tables.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from harness.etcd import EtcdCluster
from harness.groups import VENV_BIN, group_alive, pgrp_of, start_child
from harness.procs import Proc
from harness.proxy import TcpProxy
from harness.servers import MariaDbServer, PostgresServer, RedisServer

#: The example Django project (``manage.py``, ``proj``), run by the ``django`` systems.
PROJECT = Path(__file__).resolve().parent.parent / "example_project"

#: Seconds between runs of the one schedule entry.
PERIOD = 0.1
#: Lease ttl for celery-leader, ``redbeat_lock_timeout`` and ``SINGLE_BEAT_LOCK_TIME``.
TTL = 3
#: How long a paused leader stays stopped: past the ttl, so the others may take over.
PAUSE = TTL + 2.0
#: How long a partitioned leader is cut off from its store.
PARTITION = 7.0
#: Watched after the hand-over and after the fault ends: long enough for a resumed
#: stale leader to send what it will and for single-beat's 1 s heartbeat to react.
SETTLE = 1.5
#: A hand-over not seen this long after the fault ended counts as none at all.
GIVE_UP = 15.0
REPLICAS = 3

FAULTS = ("graceful", "sigkill", "sigstop", "partition", "store-restart")
FAULT_LABELS = {
    "graceful": "graceful stop",
    "sigkill": "SIGKILL",
    "sigstop": f"SIGSTOP {PAUSE:g} s",
    "partition": f"partition {PARTITION:g} s",
    "store-restart": "store restart",
}


@dataclass(frozen=True)
class System:
    key: str
    label: str
    kind: str  # "leader", "django", "redbeat" or "single-beat"
    store: str  # "redis", "postgres", "mysql", "etcd" or "file"
    #: Lease ttl / lock timeout of this system's replicas.
    ttl: float = TTL
    #: The faults to run, when not every one that applies (``benchmarks/crash_gap.py``).
    only: tuple[str, ...] = ()

    def faults(self, quick: bool) -> tuple[str, ...]:
        if self.only:
            return self.only
        if quick:
            return ("graceful", "sigkill", "partition") if self.store != "file" else FAULTS[:2]
        # A flock has no network link to cut and no server to restart.
        return FAULTS if self.store != "file" else FAULTS[:3]

    def unavailable(self) -> str | None:
        """Why this system cannot run here, or ``None``."""
        if (
            self.kind in ("leader", "django")
            and importlib.util.find_spec(f"celery_leader.backends.{self.store}") is None
        ):
            return f"celery_leader.backends.{self.store} does not exist yet"
        if self.kind == "single-beat" and not (VENV_BIN / "single-beat").exists():
            return "single-beat is not installed (pip install single-beat)"
        if self.kind == "django" and importlib.util.find_spec("django_celery_beat") is None:
            return "django-celery-beat is not installed"
        if self.kind == "redbeat" and importlib.util.find_spec("redbeat") is None:
            return "celery-redbeat is not installed"
        return None


SYSTEMS = (
    System("leader-redis", "celery-leader, Redis", "leader", "redis"),
    System("leader-postgres", "celery-leader, PostgreSQL", "leader", "postgres"),
    System("leader-mysql", "celery-leader, MariaDB", "leader", "mysql"),
    # The example project's LeaderDatabaseScheduler with django://default: the lease,
    # the claims and django-celery-beat's tables share one MariaDB database.
    System("django-mysql", "django-celery-beat, MariaDB", "django", "mysql"),
    System("leader-etcd", "celery-leader, etcd (3 members)", "leader", "etcd"),
    System("leader-file", "celery-leader, file", "leader", "file"),
    System("redbeat", "celery-redbeat", "redbeat", "redis"),
    System("single-beat", "single-beat", "single-beat", "redis"),
)


@dataclass
class Message:
    t: float  # time.monotonic() when the recorder popped it off the queue
    sent: float  # wall-clock send time, from the bench_sent header
    replica: int | None
    slot: str | None  # None: the system has no shared notion of a slot
    dup: bool = False


@dataclass
class Trial:
    fault: str
    rep: int
    t0: float
    fault_end: float
    t_end: float
    leader: int
    gap: float
    #: When a replica other than the one hit (or any, once the fault was over)
    #: first published; None: nothing within GIVE_UP, and the gap is a lower bound.
    recovered: float | None
    alive: int
    expected_alive: int
    #: Beats still running although the replica's wrapper died (single-beat's child).
    orphans: int
    #: Publishes from a second before the fault to the end, for the plot.
    messages: list[Message] = field(default_factory=list)
    #: Plot row of each publisher: the leader hit by the fault is row 0.
    rows: dict[int | None, int] = field(default_factory=dict)
    dups: int = 0

    @property
    def censored(self) -> bool:
        return self.recovered is None


@dataclass
class SystemResult:
    system: System
    trials: list[Trial] = field(default_factory=list)
    skipped: str | None = None
    dup_method: str = "slot"  # "slot" or "period"
    #: Duplicates outside any fault (while the cluster started): should be 0.
    stray_dups: int = 0

    def of(self, fault: str) -> list[Trial]:
        return [t for t in self.trials if t.fault == fault]


class Recorder:
    """Pops every message off the broker queue and notes when and from whom it came."""

    def __init__(self, broker_url: str, replica_of: Callable[[int], int | None]) -> None:
        self._redis = redis.Redis.from_url(broker_url)
        self._replica_of = replica_of
        self._lock = threading.Lock()
        self.messages: list[Message] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            item = self._redis.brpop(["celery"], timeout=0.2)
            if item is None:
                continue
            t = time.monotonic()
            headers = json.loads(item[1])["headers"]
            # Celery's ``origin`` header is "gen<pid>@<host>" of the publishing process.
            pid = int(headers["origin"].split("@")[0].removeprefix("gen"))
            slot = headers.get("leader_slot") or headers.get("bench_slot")
            # The example project's tasks carry no bench_sent; only single-beat needs it.
            sent = float(headers.get("bench_sent", 0.0))
            message = Message(t, sent, self._replica_of(pid), slot)
            with self._lock:
                self.messages.append(message)

    def since(self, t: float) -> list[Message]:
        with self._lock:
            return [m for m in self.messages if m.t > t]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._redis.close()


class Store:
    """The lock store of one system: a server on loopback, or a directory."""

    def __init__(self, kind: str, pg: PostgresServer | None) -> None:
        self.server: RedisServer | PostgresServer | MariaDbServer | None = None
        self.etcd: EtcdCluster | None = None
        self.directory: Path | None = None
        if kind == "etcd":
            self.etcd = EtcdCluster()
            self.etcd.start()
        elif kind == "redis":
            self.server = RedisServer()
            self.server.start()
        elif kind == "postgres":
            assert pg is not None
            pg.reset()
            self.server = pg
        elif kind == "mysql":
            self.server = MariaDbServer()
            self.server.start()
        else:
            self.directory = Path(tempfile.mkdtemp(prefix="bench-file-store-"))

    def ports(self) -> list[int]:
        """The ports a replica reaches the store on, each through a proxy of its own."""
        if self.etcd is not None:
            return [member.port for member in self.etcd.members]
        return [] if self.server is None else [self.server.port]

    def url_via(self, proxies: list[TcpProxy]) -> str:
        if self.etcd is not None:
            return "etcd://" + ",".join(f"127.0.0.1:{proxy.port}" for proxy in proxies)
        if self.server is None:
            return f"file://{self.directory}"
        return proxies[0].url_for(self.server.url)

    def restart(self) -> None:
        if self.etcd is not None:
            for member in self.etcd.members:
                member.stop()
            self.etcd.start()
            return
        assert self.server is not None
        self.server.stop()
        self.server.start()

    def close(self) -> None:
        if self.etcd is not None:
            self.etcd.close()
        if isinstance(self.server, RedisServer | MariaDbServer):
            self.server.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class Replica:
    index: int
    child: Proc
    proxies: list[TcpProxy]
    started: float
    retired: bool = False  # out of the cluster: stopped or killed on purpose, or found dead
    ready: bool = False


class Cluster:
    """The beat replicas of one system, topped up to ``REPLICAS`` live ones between faults."""

    def __init__(self, system: System, store: Store, broker_url: str, workdir: Path) -> None:
        self.system = system
        self.store = store
        self.broker_url = broker_url
        self.workdir = workdir
        self.replicas: list[Replica] = []
        self._pid_cache: dict[int, int | None] = {}
        self.recorder = Recorder(broker_url, self.replica_of)

    def replica_of(self, pid: int) -> int | None:
        if pid not in self._pid_cache:
            by_group = {r.child.pid: r.index for r in self.replicas}
            # single-beat's beat is a child in the wrapper's process group.
            self._pid_cache[pid] = by_group.get(pid, by_group.get(pgrp_of(pid) or -1))
        return self._pid_cache[pid]

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if not r.retired and r.child.alive]

    def spawn(self) -> Replica:
        index = len(self.replicas)
        home = self.workdir / f"replica{index}"
        home.mkdir()
        proxies = [TcpProxy("127.0.0.1", port) for port in self.store.ports()]
        store_url = self.store.url_via(proxies)
        env = {
            "BROKER_URL": self.broker_url,
            "LEADER_TTL": str(self.system.ttl),
            "BEAT_EVERY": str(PERIOD),
        }
        cwd = home
        beat = [str(VENV_BIN / "celery"), "-A", "benchmarks.apps.bench_app", "beat", "-l", "INFO"]
        beat += ["-s", str(home / "celerybeat-schedule")]
        if self.system.kind == "django":
            argv = [str(VENV_BIN / "celery"), "-A", "proj", "beat", "-l", "INFO"]
            argv += ["-S", "celery_leader.contrib.django:LeaderDatabaseScheduler"]
            env = django_env(home, store_url, self.broker_url, self.system.ttl)
            env["CELERY_LEADER_INSTANCE_ID"] = f"replica{index}"
            cwd = PROJECT  # manage.py's directory: "-A proj" imports from there
        elif self.system.kind == "leader":
            argv = [*beat, "-S", "celery_leader.LeaderScheduler"]
            env |= {"LEADER_URL": store_url, "INSTANCE_ID": f"replica{index}"}
        elif self.system.kind == "redbeat":
            argv = [*beat, "-S", "benchmarks.apps.redbeat_slots:SlotRedBeatScheduler"]
            env |= {"REDBEAT_URL": store_url}
        else:
            argv = [str(VENV_BIN / "single-beat"), *beat]
            env |= {
                "SINGLE_BEAT_REDIS_SERVER": store_url,
                "SINGLE_BEAT_LOCK_TIME": str(self.system.ttl),
                # Must be below LOCK_TIME / 2, and it is an integer: 1 s is the fastest.
                "SINGLE_BEAT_HEARTBEAT_INTERVAL": "1",
                # The default identifier is built from the command line, which differs
                # per replica (the schedule file); all replicas must share one lock.
                "SINGLE_BEAT_IDENTIFIER": "bench-beat",
                "SINGLE_BEAT_LOG_LEVEL": "info",
            }
        child = start_child(argv, env, cwd, home / "out.log")
        replica = Replica(index, child, proxies, time.monotonic())
        self.replicas.append(replica)
        return replica

    def wait_ready(self, replica: Replica, timeout: float = 30.0) -> None:
        """Until the replica is past start-up and competing for the lock."""
        deadline = time.monotonic() + timeout
        while not replica.ready and time.monotonic() < deadline:
            if not replica.child.alive:
                return  # measured as it is: a replica that cannot start does not survive
            if self.system.kind == "single-beat":
                # A waiting wrapper prints nothing; it tries the lock at once, then every 1 s.
                replica.ready = time.monotonic() - replica.started > 1.5
            elif "beat: Starting..." in replica.child.output():
                time.sleep(0.3)  # past the banner: joining the election or taking the lock
                replica.ready = True
            time.sleep(0.05)
        if not replica.ready:
            raise RuntimeError(f"{self.system.label}: replica {replica.index} did not start")

    def top_up(self) -> None:
        """Replace the replicas that died, and wait until every live one is ready.

        A dead replica's process group is killed first, as a container runtime or
        systemd would when the main process exits: a wrapper that died may have
        left its beat running (an "orphaned beat").
        """
        for replica in self.replicas:
            if not replica.child.alive:
                replica.child.kill_group()
                replica.retired = True
        while len(self.live()) < REPLICAS:
            self.spawn()
        for replica in self.live():
            self.wait_ready(replica)

    def wait_steady(self, timeout: float = 30.0) -> Replica:
        """Until one live replica has published steadily for a second; return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            recent = self.recorder.since(time.monotonic() - 1.0)
            if len(recent) >= 0.5 / PERIOD and time.monotonic() - recent[-1].t < 3 * PERIOD:
                index = recent[-1].replica
                replica = self.replicas[index] if index is not None else None
                if replica is not None and replica.child.alive and not replica.retired:
                    return replica
            time.sleep(0.05)
        raise RuntimeError(f"{self.system.label}: no replica publishes steadily")

    def close(self) -> None:
        self.recorder.close()
        for replica in self.replicas:
            replica.child.kill_group()
            for proxy in replica.proxies:
                proxy.close()


def django_env(data: Path, db_url: str, broker_url: str, ttl: float) -> dict[str, str]:
    """The example project on MariaDB at ``db_url``, its database as the lease store."""
    return {
        "PYTHONPATH": f"{PROJECT}:{PROJECT.parent}",
        "DJANGO_SETTINGS_MODULE": "proj.settings",
        "DEMO_DATA": str(data),
        "DJANGO_MYSQL": db_url.split("://", 1)[1],
        "CELERY_LEADER_URL": "django://default",
        "CELERY_BROKER_URL": broker_url,
        "CELERY_LEADER_TTL": str(ttl),
        "DEMO_EVERY": "1",
    }


#: A django-celery-beat row due every ``PERIOD``. Code entries become rows with
#: whole seconds (0.1 s would turn into 0: due on every tick); a row may count in
#: microseconds.
TICK_ROW = f"""
from django_celery_beat.models import IntervalSchedule, PeriodicTask
every, _ = IntervalSchedule.objects.get_or_create(
    every={round(PERIOD * 1e6)}, period=IntervalSchedule.MICROSECONDS
)
PeriodicTask.objects.create(name="bench tick", task="ticker.tasks.heartbeat", interval=every)
"""


def migrate(store: Store, workdir: Path) -> None:
    """Create the example project's tables in the store's database, with :data:`TICK_ROW`."""
    assert store.server is not None
    env = {**os.environ, **django_env(workdir, store.server.url, "redis://", TTL)}
    manage = [str(VENV_BIN / "python"), str(PROJECT / "manage.py")]
    for argv in (["migrate", "--no-input"], ["shell", "-c", TICK_ROW]):
        done = subprocess.run(
            [*manage, *argv],
            env=env, cwd=PROJECT, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {argv[0]} failed: {done.stderr.strip()[-500:]}")


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def run_trial(cluster: Cluster, fault: str, rep: int) -> Trial:
    cluster.top_up()
    # The previous hand-over set the new leader's renew and poll cycles going at a
    # fixed offset from here; a random wait puts the fault anywhere in them.
    time.sleep(random.uniform(0, 1.0))
    leader = cluster.wait_steady()
    before = {r.index for r in cluster.live()}
    t0 = time.monotonic()
    if fault == "graceful":
        leader.child.signal(signal.SIGTERM, group=False)
        leader.retired = True
        fault_end = t0
    elif fault == "sigkill":
        leader.child.kill_group()
        leader.retired = True
        fault_end = t0
    elif fault == "sigstop":
        leader.child.signal(signal.SIGSTOP)
        fault_end = t0 + PAUSE
        _sleep_until(fault_end)
        leader.child.signal(signal.SIGCONT)
    elif fault == "partition":
        assert leader.proxies
        for proxy in leader.proxies:
            proxy.hold()
        fault_end = t0 + PARTITION
        _sleep_until(fault_end)
        for proxy in leader.proxies:
            proxy.release()
    else:
        cluster.store.restart()
        fault_end = time.monotonic()

    # Recovered: another replica publishes, or anyone does once the fault is over
    # (a file lock stays with a paused holder; a store restart may keep the leader).
    recovered = None
    while recovered is None and time.monotonic() < fault_end + GIVE_UP:
        for m in cluster.recorder.since(t0):
            if m.replica != leader.index or m.t > fault_end:
                recovered = m.t
                break
        else:
            time.sleep(0.05)
    if recovered is None:
        t_end = time.monotonic()
    else:
        if fault in ("graceful", "sigkill"):
            # The replacement boots while the hand-over settles, as an orchestrator's
            # would; it is not competing yet when the next fault starts.
            cluster.spawn()
        t_end = max(fault_end, recovered) + SETTLE
        _sleep_until(t_end)
    if fault == "graceful" and leader.child.alive:
        time.sleep(2.0)  # a beat that ignored SIGTERM would distort the next fault
        leader.child.kill_group()

    window = [m for m in cluster.recorder.since(t0 - 2.0) if m.t <= t_end]
    prior = [m.t for m in window if m.t <= t0]
    after = [m.t for m in window if m.t > t0]
    times = prior[-1:] + after
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if recovered is None:
        gaps.append(t_end - times[-1])
    shown = [m for m in window if m.t >= t0 - 1.0]
    rows: dict[int | None, int] = {leader.index: 0}
    for m in shown:
        rows.setdefault(m.replica, len(rows))
    expected = len(before) - (1 if fault in ("graceful", "sigkill") else 0)
    alive = sum(
        1 for r in cluster.replicas if r.index in before and not r.retired and r.child.alive
    )
    orphans = sum(
        1
        for r in cluster.replicas
        if r.index in before and not r.child.alive and group_alive(r.child.pid)
    )
    return Trial(
        fault, rep, t0, fault_end, t_end, leader.index, max(gaps), recovered, alive, expected,
        orphans, messages=shown, rows=rows,
    )  # fmt: skip


def mark_duplicates(messages: list[Message], by_slot: bool) -> None:
    """Flag every publish of a slot that went out before.

    With slots (celery-leader's ``leader_slot``, redbeat's entry + ``last_run_at``)
    a repeat is exact. Without them (single-beat), publishes are ordered by send
    time and one sent less than half a period after the last counted one is a
    repeat: one publisher never sends that fast, two publishers do it once per period.
    """
    if by_slot:
        seen: set[str | None] = set()
        for m in sorted(messages, key=lambda m: m.t):
            m.dup = m.slot in seen
            seen.add(m.slot)
        return
    last = float("-inf")
    for m in sorted(messages, key=lambda m: m.sent):
        m.dup = m.sent - last < PERIOD / 2
        if not m.dup:
            last = m.sent


def _attribute_duplicates(result: SystemResult, messages: list[Message]) -> None:
    """Count each duplicate against the fault it followed (until the next one began)."""
    trials = sorted(result.trials, key=lambda t: t.t0)
    for m in messages:
        if not m.dup:
            continue
        owner = None
        for trial in trials:
            if trial.t0 - 1.0 <= m.t:
                owner = trial
        if owner is None:
            result.stray_dups += 1
        else:
            owner.dups += 1


def run_system(
    system: System,
    reps: int,
    quick: bool,
    broker: RedisServer,
    pg: PostgresServer | None,
    log: Callable[[str], None],
    restarts: int = 1,
) -> SystemResult:
    result = SystemResult(system, dup_method="period" if system.kind == "single-beat" else "slot")
    reason = system.unavailable()
    if reason is None and system.store == "postgres" and pg is None:
        reason = "PostgreSQL did not start"
    if reason is not None:
        result.skipped = reason
        log(f"  skipped {system.label}: {reason}")
        return result
    with broker.client() as client:
        client.flushall()
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{system.key}-"))
    store = Store(system.store, pg)
    cluster = Cluster(system, store, broker.url, workdir)
    try:
        if system.kind == "django":
            migrate(store, workdir)
        faults = system.faults(quick)
        plan = [(f, rep) for rep in range(reps) for f in faults if f != "store-restart"]
        # At the end: redbeat's beats do not survive it, and no other fault should
        # start from a wiped store. Restarts in a row each start from replicas topped
        # up to three, so every one is measured like the first.
        if "store-restart" in faults:
            plan += [("store-restart", rep) for rep in range(restarts)]
        for fault, rep in plan:
            trial = run_trial(cluster, fault, rep)
            result.trials.append(trial)
            log(
                f"  {system.label:27} {FAULT_LABELS[fault]:15} rep {rep + 1}: gap "
                f"{'>' if trial.censored else ''}{trial.gap:.2f} s, "
                f"alive {trial.alive}/{trial.expected_alive}"
            )
        time.sleep(0.5)  # let the last messages reach the recorder
    except RuntimeError as exc:
        result.skipped = f"stopped early: {exc}"
        log(f"  {system.label}: {result.skipped}; logs in {workdir}")
    finally:
        cluster.close()
        store.close()
    messages = cluster.recorder.messages
    mark_duplicates(messages, by_slot=result.dup_method == "slot")
    _attribute_duplicates(result, messages)
    for trial in result.trials:
        if trial.dups:
            log(f"  {system.label}: {trial.dups} duplicate(s) after {trial.fault} #{trial.rep + 1}")
    if result.skipped is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def run(
    reps: int,
    quick: bool,
    log: Callable[[str], None],
    systems: tuple[System, ...] = SYSTEMS,
    restarts: int = 1,
) -> list[SystemResult]:
    broker = RedisServer()
    broker.start()
    pg: PostgresServer | None = None
    if any(s.store == "postgres" and s.unavailable() is None for s in systems):
        pg = PostgresServer()
        try:
            pg.start()
        except (AssertionError, RuntimeError) as exc:
            log(f"  PostgreSQL did not start: {exc}")
            pg.close()
            pg = None
    try:
        return [run_system(s, reps, quick, broker, pg, log, restarts) for s in systems]
    finally:
        broker.close()
        if pg is not None:
            pg.close()


# -- reporting ---------------------------------------------------------------


def _seconds(trials: list[Trial]) -> str:
    if not trials:
        return "n/a"
    gaps = [t.gap for t in trials]
    mark = ">" if any(t.censored for t in trials) else ""
    if len(trials) == 1:
        return f"{mark}{gaps[0]:.2f}"
    return f"{statistics.median(gaps):.2f} / {mark}{max(gaps):.2f}"


def _table_head(results: list[SystemResult]) -> tuple[list[str], list[str]]:
    """The faults any system ran, and the Markdown header of a table with one column each."""
    faults = [f for f in FAULTS if any(r.of(f) for r in results)]
    lines = [
        "| system | " + " | ".join(FAULT_LABELS[f] for f in faults) + " |",
        "|---" * (len(faults) + 1) + "|",
    ]
    return faults, lines


def handover_table(results: list[SystemResult]) -> str:
    faults, lines = _table_head(results)
    for r in results:
        if r.skipped and not r.trials:
            cells = [f"skipped: {r.skipped}"] + [""] * (len(faults) - 1)
        else:
            cells = [_seconds(r.of(f)) for f in faults]
        lines.append(f"| {r.system.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def safety_table(results: list[SystemResult]) -> str:
    faults, lines = _table_head(results)
    for r in results:
        if r.skipped and not r.trials:
            continue
        cells = []
        for f in faults:
            trials = r.of(f)
            if not trials:
                cells.append("n/a")
                continue
            dups = sum(t.dups for t in trials)
            alive = sum(t.alive for t in trials)
            expected = sum(t.expected_alive for t in trials)
            orphans = sum(t.orphans for t in trials)
            cells.append(
                f"{dups} dup, {alive}/{expected} alive"
                + (f", {orphans} orphaned beat" if orphans else "")
            )
        mark = " (by period)" if r.dup_method == "period" else ""
        lines.append(f"| {r.system.label}{mark} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[SystemResult], path: Path) -> None:
    """One row per system, one column per fault: the first repetition's publishes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.trials]
    faults = [f for f in FAULTS if any(r.of(f) for r in shown)]
    if not shown:
        return
    fig, axes = plt.subplots(
        len(shown), len(faults), figsize=(3.3 * len(faults), 1.5 * len(shown) + 0.8),
        squeeze=False, sharey=True,
    )  # fmt: skip
    # One time scale per column, so systems compare at a glance.
    spans = {
        f: max((r.of(f)[0].t_end - r.of(f)[0].t0 for r in shown if r.of(f)), default=1.0)
        for f in faults
    }
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")
    for i, r in enumerate(shown):
        for j, fault in enumerate(faults):
            ax = axes[i][j]
            trials = r.of(fault)
            ax.set_yticks(range(REPLICAS), ["A", "B", "C"][:REPLICAS])
            ax.set_ylim(-0.6, REPLICAS - 0.4)
            ax.invert_yaxis()
            if i == len(shown) - 1:
                ax.set_xlabel("s after the fault")
            if j == 0:
                ax.set_ylabel(r.system.label.replace(", ", "\n"), fontsize=8)
            if not trials:
                ax.text(0.5, 0.5, "n/a", ha="center", va="center", transform=ax.transAxes)
                ax.set_xticks([])
                continue
            trial = trials[0]
            if trial.fault_end > trial.t0:
                ax.axvspan(0, trial.fault_end - trial.t0, color="0.9")
            ax.axvline(0, color="k", lw=0.8)
            for m in trial.messages:
                row, dt = trial.rows[m.replica], m.t - trial.t0
                ax.plot(
                    [dt, dt], [row - 0.35, row + 0.35],
                    color="red" if m.dup else colors[row % len(colors)], lw=1.4 if m.dup else 0.9,
                )  # fmt: skip
            ax.set_xlim(-1.0, spans[fault])
            title = f"gap {'>' if trial.censored else ''}{trial.gap:.2f} s"
            if trial.dups:
                title += f", {trial.dups} dup"
            if i == 0:
                title = f"{FAULT_LABELS[fault]}\n{title}"
            ax.set_title(title, fontsize=8)
            ax.tick_params(labelsize=7)
    fig.suptitle(
        f"One fail-over per system: each tick is a publish; A is the leader hit at 0 s; "
        f"grey: fault; red: duplicate (ttl {TTL} s, entry every {PERIOD} s)",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    """Run this benchmark alone and print its tables (``benchmarks/run.py`` runs them all)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 run, fewer faults")
    parser.add_argument("--reps", type=int, help="runs of each fault (default 5; --quick: 1)")
    parser.add_argument(
        "--restarts", type=int, default=1, help="store restarts per system (default 1)"
    )
    parser.add_argument("systems", nargs="*", metavar="SYSTEM")
    args = parser.parse_args(argv)
    known = [s.key for s in SYSTEMS]
    unknown = [name for name in args.systems if name not in known]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    systems = tuple(s for s in SYSTEMS if not args.systems or s.key in args.systems)
    reps = args.reps or (1 if args.quick else 5)
    results = run(reps, args.quick, lambda line: print(line, flush=True), systems, args.restarts)
    print(f"\n{handover_table(results)}\n\n{safety_table(results)}")

    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
