"""Scale: a leader and a standby with N hourly entries plus one entry due every second.

    .venv/bin/python -m benchmarks.scale [--n 1000,10000,100000] [--store-n 1000000]
        [--only leader,leader-store,redbeat,django] [--store redis,postgres,mysql,etcd,file]
        [--seconds 30] [--cap 600] [--burst 100000]

Each system runs as real ``celery beat`` processes (``benchmarks/apps/scale_app.py``)
on loopback servers started here, ttl (redbeat: lock timeout) 5 s:

* ``leader``: ``LeaderScheduler``, the N entries in ``beat_schedule`` (for each N
  of ``--n``);
* ``leader-store``: ``LeaderScheduler``, the N entries kept in the store, loaded in
  batches of compare-and-set edits before the beats start (for each N of ``--n``,
  and ``--store-n``); the file store takes them in one edit, since each edit
  rewrites its whole entries file (batches would make the seed quadratic);

  both on each store of ``--store`` (default Redis), a server of its own started
  here (etcd: one member; file: a directory);
* ``redbeat``: celery-redbeat with the same ``beat_schedule``, which it writes
  into its Redis when it starts;
* ``django``: django-celery-beat's ``DatabaseScheduler`` on PostgreSQL with N
  rows. It has no lock, so it runs without a standby and has no hand-over.

The hourly entries are due at a minute half an hour away, so none fires during
a run: what is measured is the cost of carrying them. The second entry
(``tick``) is what the broker sees; a thread here pops every message off the
broker's Redis and stamps its arrival. A run first starts the leader, then the
standby, waits until the leader has loaded every entry's state (its log says
so) and the standby's CPU use settles, measures a window of ``--seconds``,
then sends SIGTERM to the leader, starts a new standby, and sends SIGKILL to
the new leader's process group. A run that passes ``--cap`` seconds stops
where it is; one whose leader loses its term while loading fails at once.

Columns:

* **setup**: seconds to put the N entries in the store before the start
  (store entries, django rows); code entries have none.
* **start**: from starting the first replica to its first ``tick`` at the broker
  (its first dispatch); with store entries, the leader goes on reading them page
  by page, and **read all** (in the summary) is how long its whole read took, as
  its log says; **state loaded** is how long its term took to load (or, for
  entries new to the store, anchor) every entry's state, as it logs it.
* **CPU**: the leader's CPU seconds per second over the window (utime + stime
  of its process group, from ``/proc``).
* **RSS**: the leader's resident memory at the end of the window, MB.
* **store ops/s**: Redis commands per second over the window (``INFO stats``
  ``total_commands_processed``, less this benchmark's own ``INFO`` calls);
  on PostgreSQL (django, or ``--store postgres``), transactions per second
  (``pg_stat_database``); not measured on the other stores.
* **late p50 / p99**: how long after its due time each ``tick`` in the window
  reached the broker. The due time is the one in its ``leader_slot`` header;
  for redbeat and django, whose slots are stamped by the benchmark's scheduler
  subclass with the ``last_run_at`` they were due after, that plus 1 s.
* **max gap**: the longest interval between consecutive ``tick`` arrivals in
  the window (1 s when nothing is late).
* **edit CPU** (store entries): the CPU seconds the leader and the standby
  spend, above their idle rate, in the ``EDIT_WINDOW`` seconds after one
  entry is edited (both keep the entries' jobs made): the larger of the two, per
  replica.
* **SIGTERM**, **SIGKILL**: from the signal to the standby's first ``tick`` at
  the broker. The standby publishes the next slot when it is due, so up to 1 s
  of it is the schedule, not the hand-over.
* ``—``: not reached within ``--cap``, or does not apply.

A second table sums up each celery-leader row: first dispatch (the start), RSS per
entry (the leader's RSS over N), edit CPU per replica in ms and idle CPU.

Then ``--burst`` entries fall due in the same second and the leader's publish
rate is set against a bare ``send_task`` loop on the same broker
(:mod:`benchmarks.burst`, which prints its own table; ``--burst 0`` skips it).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import redis
from celery import Celery

from benchmarks import burst
from celery_leader.backends import Edit, open_store
from celery_leader.schedule.entries import Entry, instant_now, new_entry
from celery_leader.settings.config import LeaderConfig
from harness.etcd import EtcdCluster
from harness.groups import VENV_BIN, group_cpu_seconds, kill_all, start_child
from harness.procs import Proc
from harness.servers import MariaDbServer, PostgresServer, RedisServer

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "example_project"
TTL = 5.0
TICK_TASKS = ("scale.tick", "ticker.tasks.heartbeat")
HOURLY_TASK = "scale.hourly"
#: Store entries per compare-and-set batch when loading them.
BATCH = 5_000
#: A standby has started up once it used less CPU than this in each of
#: ``QUIET`` seconds in a row (while it imports and loads, it uses more).
SETTLED_CPU = 0.1
QUIET = 2
SETTLE_MAX = 120.0
#: Seconds over which the CPU an edit costs is counted: the replicas see an edit
#: within the entries poll (0.5 s) and, at a million entries, re-list their jobs
#: in well under this.
EDIT_WINDOW = 5.0
SYSTEMS = ("leader", "leader-store", "redbeat", "django")
#: Where celery-leader's rows keep their lease, state and store entries.
STORES = ("redis", "postgres", "mysql", "etcd", "file")
LABELS = {
    "leader": "celery-leader, code entries",
    "leader-store": "celery-leader, store entries",
    "redbeat": "celery-redbeat",
    "django": "django-celery-beat (PostgreSQL)",
}
T = TypeVar("T")


class OverCap(Exception):
    """The run passed its time cap: the cells not measured yet stay empty."""


@dataclass
class Row:
    system: str
    n: int
    store: str = "redis"
    setup: float | None = None
    start: float | None = None
    cpu: float | None = None
    rss_mb: float | None = None
    ops: float | None = None
    late_p50: float | None = None
    late_p99: float | None = None
    max_gap: float | None = None
    edit_cpu: float | None = None
    read_all: float | None = None
    loaded: float | None = None
    sigterm: float | None = None
    sigkill: float | None = None
    note: str = ""


@dataclass
class Message:
    t: float  # time.monotonic() when popped off the broker
    wall: float  # time.time() then
    pid: int
    slot: str | None
    due: datetime.datetime | None


@dataclass
class Recorder:
    """Pops every ``tick`` message off the broker's ``celery`` list and stamps it."""

    url: str
    messages: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._client = redis.Redis.from_url(self.url)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            item = self._client.brpop(["celery"], timeout=0.2)
            if item is None:
                continue
            t, wall = time.monotonic(), time.time()
            headers = json.loads(item[1])["headers"]
            if headers.get("task") not in TICK_TASKS:
                continue
            # Celery's ``origin`` header is "gen<pid>@<host>" of the publishing process.
            pid = int(headers["origin"].split("@")[0].removeprefix("gen"))
            slot = headers.get("leader_slot") or headers.get("bench_slot")
            message = Message(t, wall, pid, slot, _due(headers))
            with self._lock:
                self.messages.append(message)

    def between(self, t0: float, t1: float = float("inf")) -> list[Message]:
        with self._lock:
            return [m for m in self.messages if t0 < m.t <= t1]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._client.close()


def _due(headers: dict[str, Any]) -> datetime.datetime | None:
    """The due time of a message: in its ``leader_slot``, or 1 s after the
    ``last_run_at`` in its ``bench_slot`` (the ``tick`` entry's period)."""
    if headers.get("leader_slot"):
        return datetime.datetime.fromisoformat(headers["leader_slot"].rsplit("@", 1)[1])
    bench = headers.get("bench_slot", "")
    last = bench.rsplit("@", 1)[1] if "@" in bench else "never"
    if last == "never":
        return None
    due = datetime.datetime.fromisoformat(last) + datetime.timedelta(seconds=1)
    return due if due.tzinfo else due.replace(tzinfo=datetime.timezone.utc)


class Run:
    """One system at one N: its servers, its replicas, and the time it has left."""

    def __init__(
        self, system: str, n: int, cap: float, pg: PostgresServer | None, store: str = "redis"
    ) -> None:
        self.system, self.n, self.pg = system, n, pg
        self.deadline = time.monotonic() + cap
        self.home = Path(tempfile.mkdtemp(prefix=f"bench-scale-{system}-"))
        self.broker = RedisServer()
        self.broker.start()
        # "celery": plain `celery beat` (PersistentScheduler), for benchmarks/start.py.
        # redbeat keeps its schedule in Redis whatever --store says.
        if system in ("django", "celery"):
            store = "none"
        elif system == "redbeat":
            store = "redis"
        self.store_kind = store
        self.store: RedisServer | None = None
        self._server: Any = None  # the store's server, other than Redis
        self.store_url = ""
        if store == "redis":
            self.store = RedisServer()
            self.store.start()
            self.store_url = self.store.url
        elif store == "file":
            self.store_url = f"file://{self.home / 'store'}"
        elif store != "none":
            self._server = {
                "postgres": PostgresServer, "mysql": MariaDbServer,
                "etcd": lambda: EtcdCluster(size=1),
            }[store]()  # fmt: skip
            self._server.start()
            self.store_url = self._server.url
            if store == "postgres":
                self.pg = self._server
        self.recorder = Recorder(self.broker.url)
        # One connection for the whole window: a new one would add its handshake's
        # commands to what is counted.
        self._stats = self.store.client() if self.store is not None else None
        # The hourly entries' minute: half an hour from now, outside the run.
        self.minute = (datetime.datetime.now(datetime.timezone.utc).minute + 30) % 60
        self._replicas = 0

    def wait(self, predicate: Callable[[], T | None], interval: float = 0.05) -> T:
        """Poll ``predicate`` until it returns something; :class:`OverCap` at the deadline."""
        while time.monotonic() < self.deadline:
            value = predicate()
            if value is not None:
                return value
            time.sleep(interval)
        raise OverCap

    def spawn(self) -> Proc:
        index, self._replicas = self._replicas, self._replicas + 1
        env = {"BROKER_URL": self.broker.url, "LEADER_TTL": str(TTL)}
        cwd = ROOT
        argv = [str(VENV_BIN / "celery"), "-A", "benchmarks.apps.scale_app", "beat", "-l", "INFO"]
        argv += ["-s", str(self.home / f"schedule{index}")]
        env |= {"SCALE_MINUTE": str(self.minute), "INSTANCE_ID": f"replica{index}"}
        env["SCALE_CODE_N"] = str(self.n if self.system in ("leader", "redbeat", "celery") else 0)
        if self.system == "celery":
            pass  # Celery's own PersistentScheduler, its shelve in ``-s``
        elif self.system in ("leader", "leader-store"):
            argv += ["-S", "celery_leader.LeaderScheduler"]
            env["LEADER_URL"] = self.store_url
        elif self.system == "redbeat":
            assert self.store is not None
            argv += ["-S", "benchmarks.apps.redbeat_slots:SlotRedBeatScheduler"]
            env["REDBEAT_URL"] = self.store.url
        else:
            argv = [str(VENV_BIN / "celery"), "-A", "proj", "beat", "-l", "INFO"]
            argv += ["-S", "benchmarks.apps.django_slots:SlotDatabaseScheduler"]
            argv += ["-s", str(self.home / f"schedule{index}")]
            env = django_env(self.home, self.pg_url(), self.broker.url)
            cwd = PROJECT
        return start_child(argv, env, cwd, self.home / f"replica{index}.log")

    def pg_url(self) -> str:
        assert self.pg is not None
        return self.pg.url

    def first_tick(self, proc: Proc, since: float) -> float:
        """Seconds from ``since`` to ``proc``'s first ``tick`` at the broker."""
        first = self.wait(
            lambda: next((m for m in self.recorder.between(since) if m.pid == proc.pid), None)
        )
        return first.t - since

    def settle(self, proc: Proc) -> None:
        """Until ``proc`` has started up: :data:`QUIET` seconds in a row under
        :data:`SETTLED_CPU` each, or at most :data:`SETTLE_MAX` seconds (a standby
        that never idles is measured as it is)."""
        give_up = time.monotonic() + SETTLE_MAX
        samples = [group_cpu_seconds(proc.pid)]

        def settled() -> bool | None:
            samples.append(group_cpu_seconds(proc.pid))
            used = [b - a for a, b in itertools.pairwise(samples[-QUIET - 1 :])]
            quiet = len(used) == QUIET and max(used) < SETTLED_CPU
            return True if quiet or time.monotonic() > give_up else None

        self.wait(settled, interval=1.0)

    def store_ops(self) -> int | None:
        """Commands (Redis) or transactions (PostgreSQL) the store has processed so far
        (``None``: not counted on this store)."""
        if self._stats is not None:
            return int(self._stats.info("stats")["total_commands_processed"])
        if self.pg is None:
            return None
        with psycopg.connect(self.pg.superuser_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                (self.pg.user,),
            ).fetchone()
        assert row is not None
        return int(row[0])

    def close(self) -> None:
        kill_all()
        self.recorder.close()
        if self._stats is not None:
            self._stats.close()
        self.broker.close()
        if self.store is not None:
            self.store.close()
        if self._server is not None:
            self._server.close()


def django_env(data: Path, db_url: str, broker_url: str) -> dict[str, str]:
    """The example project on PostgreSQL at ``db_url``, its 1 s ``heartbeat`` as the tick."""
    return {
        "PYTHONPATH": f"{PROJECT}:{ROOT}",
        "DJANGO_SETTINGS_MODULE": "proj.settings",
        "DEMO_DATA": str(data),
        "DJANGO_POSTGRES": db_url.split("://", 1)[1],
        "CELERY_BROKER_URL": broker_url,
        "DEMO_EVERY": "1",
    }


#: The django rows: N hourly crontab rows (the 1 s heartbeat comes from the
#: project's ``CELERY_BEAT_SCHEDULE`` when beat starts).
DJANGO_ROWS = """
from django_celery_beat.models import CrontabSchedule, PeriodicTask
PeriodicTask.objects.all().delete()
hourly, _ = CrontabSchedule.objects.get_or_create(minute="{minute}", hour="*",
    day_of_week="*", day_of_month="*", month_of_year="*", timezone="UTC")
PeriodicTask.objects.bulk_create(
    (PeriodicTask(name=f"hourly{{i}}", task="{task}", crontab=hourly) for i in range({n})),
    batch_size={batch},
)
"""


def load_django_rows(run: Run) -> None:
    """Migrate (a no-op after the first run) and replace every row with N hourly ones."""
    env = {**os.environ, **django_env(run.home, run.pg_url(), run.broker.url)}
    manage = [str(VENV_BIN / "python"), str(PROJECT / "manage.py")]
    rows = DJANGO_ROWS.format(minute=run.minute, task=HOURLY_TASK, n=run.n, batch=BATCH)
    for argv in (["migrate", "--no-input"], ["shell", "-c", rows]):
        done = subprocess.run(
            [*manage, *argv], env=env, cwd=PROJECT, capture_output=True, text=True,
            timeout=max(1.0, run.deadline - time.monotonic()), check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {argv[0]} failed: {done.stderr.strip()[-500:]}")


def load_store_entries(url: str, n: int, minute: int) -> Edit:
    """N hourly entries in the store, in batches of adds (one round trip each; etcd:
    one per 63; the file store all in one, as each edit rewrites its whole file);
    returns an edit of one of them (new kwargs, the same schedule).

    One entry is built and checked by the entries API; the others are its JSON
    with their own name and generation, as the API would store them, since
    checking a million identical entries one by one would take longer than
    the run.
    """
    app = Celery("scale_loader", set_as_current=False)
    app.conf.leader_url = url
    config = LeaderConfig.from_app(app)
    backend = open_store(config)
    template = new_entry(instant_now(), name="hourly0", task=HOURLY_TASK, cron=f"{minute} * * * *")
    fields = json.loads(template.to_json())

    def stored(i: int) -> str:
        named = {**fields, "name": f"hourly{i}", "generation": uuid.uuid4().hex}
        return json.dumps(named, sort_keys=True, separators=(",", ":"))

    assert Entry.from_json(stored(1)).generation != template.generation
    probe, text = f"hourly{n // 2}", ""
    batch = max(n, 1) if config.store_kind == "file" else BATCH
    try:
        for first in range(0, n, batch):
            edits = [
                Edit(f"hourly{i}", None, stored(i)) for i in range(first, min(n, first + batch))
            ]
            if not all(backend.entries.edit(config.beat_election, edits)):
                raise RuntimeError("an entry existed already in a fresh store")
            text = next((e.new for e in edits if e.key == probe), None) or text
    finally:
        backend.close()
    edited = json.dumps({**json.loads(text), "kwargs": {"edited": True}}, sort_keys=True)
    return Edit(probe, text, edited)


def edit_cost(run: Run, edit: Edit, pids: Sequence[int], idle: Sequence[float]) -> float:
    """The most CPU seconds one of the replicas ``pids`` spends on ``edit`` above its
    ``idle`` rate (s/s)."""
    config = LeaderConfig.from_mapping({"leader_url": run.store_url})
    backend = open_store(config)
    try:
        cpu0, t0 = [group_cpu_seconds(p) for p in pids], time.monotonic()
        if backend.entries.edit(config.beat_election, [edit]) != [True]:
            raise RuntimeError(f"the edit of {edit.key} did not apply")
    finally:
        backend.close()
    run.wait(lambda: True if time.monotonic() >= t0 + EDIT_WINDOW else None, interval=0.2)
    cpu1, t1 = [group_cpu_seconds(p) for p in pids], time.monotonic()
    spent = [b - a - rate * (t1 - t0) for a, b, rate in zip(cpu0, cpu1, idle, strict=True)]
    return max(0.0, *spent)  # below the idle rate: noise


#: The leader's line once a term has loaded every entry's state.
LOADED = re.compile(r"loaded the state of \d+ entries in ([\d.]+) s")
#: What a leader logs when its term ends (``elected ... `` then this).
LOST = re.compile(r"^.*no longer lead.*$", re.MULTILINE)


def loaded(log: str) -> re.Match[str] | None:
    """The leader's line that it loaded every entry's state, if ``log`` has it yet; a
    leader that lost its term first fails the run (its successor loads anew, and the
    run would wait for the line until its cap)."""
    found = LOADED.search(log)
    lost = LOST.search(log)
    if lost is not None and (found is None or lost.start() < found.start()):
        raise RuntimeError(f"the leader lost its term while loading: {lost.group(0)}")
    return found


def whole_read(log: Path) -> float | None:
    """Seconds the first whole read of the store entries took, as the replica logged it."""
    found = re.search(r"read \d+ schedule entries in ([\d.]+) s", log.read_text(errors="replace"))
    return None if found is None else float(found.group(1))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def measure(run: Run, row: Row, seconds: float, log: Callable[[str], None]) -> None:
    """Fill ``row`` as far as the run's cap allows (see the module docstring)."""
    edit = None
    if run.system == "leader-store":
        t = time.monotonic()
        edit = load_store_entries(run.store_url, run.n, run.minute)
        row.setup = time.monotonic() - t
    elif run.system == "django":
        t = time.monotonic()
        load_django_rows(run)
        row.setup = time.monotonic() - t
    if row.setup is not None:
        log(f"    setup {row.setup:.1f} s")
    t = time.monotonic()
    leader = run.spawn()
    row.start = run.first_tick(leader, t)
    log(f"    start -> first dispatch {row.start:.2f} s")
    standby = run.spawn() if run.system != "django" else None
    if run.system in ("leader", "leader-store"):
        # The window is the leader at rest: after its term's whole load (at a million
        # new entries, minutes of anchoring them, which the window would count).
        replica0 = run.home / "replica0.log"
        found = run.wait(lambda: loaded(replica0.read_text(errors="replace")))
        row.loaded = float(found.group(1))
        log(f"    every entry's state loaded in {row.loaded:.1f} s")
    if standby is not None:
        run.settle(standby)
    pids = [leader.pid] if standby is None else [leader.pid, standby.pid]
    ops0, t0 = run.store_ops(), time.monotonic()
    cpu0 = [group_cpu_seconds(p) for p in pids]
    run.wait(lambda: True if time.monotonic() >= t0 + seconds else None, interval=0.2)
    ops1, t1 = run.store_ops(), time.monotonic()
    idle = [(group_cpu_seconds(p) - c) / (t1 - t0) for p, c in zip(pids, cpu0, strict=True)]
    row.cpu, row.rss_mb = idle[0], rss_mb(leader.pid)
    row.read_all = whole_read(run.home / "replica0.log")
    if ops0 is not None and ops1 is not None:
        row.ops = (ops1 - ops0 - 1) / (t1 - t0)  # less the INFO call that read ops1
    ticks = run.recorder.between(t0, t1)
    lateness = [m.wall - m.due.timestamp() for m in ticks if m.due is not None]
    if lateness:
        row.late_p50, row.late_p99 = percentile(lateness, 0.5), percentile(lateness, 0.99)
    if len(ticks) > 1:
        row.max_gap = max(b.t - a.t for a, b in itertools.pairwise(ticks))
    log(
        f"    window {t1 - t0:.0f} s: CPU {row.cpu:.3f} s/s, RSS {row.rss_mb:.0f} MB, "
        f"{cell(row.ops, '.0f')} ops/s, {len(ticks)} ticks, max gap {row.max_gap or 0:.2f} s"
    )
    if edit is not None:
        row.edit_cpu = edit_cost(run, edit, pids, idle)
        log(f"    one edit: {row.edit_cpu * 1000:.0f} ms of CPU (the most of one replica)")
    if standby is None:
        row.note = "no lock: no standby"
        return
    t = time.monotonic()
    leader.signal(signal.SIGTERM, group=False)
    row.sigterm = run.first_tick(standby, t)
    log(f"    SIGTERM -> standby's first dispatch {row.sigterm:.2f} s")
    leader.kill_group()
    leader, standby = standby, run.spawn()
    run.settle(standby)
    t = time.monotonic()
    leader.kill_group()
    row.sigkill = run.first_tick(standby, t)
    log(f"    SIGKILL -> standby's first dispatch {row.sigkill:.2f} s")


def run_one(
    system: str, n: int, seconds: float, cap: float, pg: PostgresServer | None,
    log: Callable[[str], None], store: str = "redis",
) -> Row:  # fmt: skip
    row = Row(system, n, store if system in ("leader", "leader-store") else "redis")
    log(f"  {label(row)}, N = {n:,}")
    run = Run(system, n, cap, pg, store)
    finished = False
    try:
        measure(run, row, seconds, log)
        finished = True
    except OverCap:
        row.note = f"{'nothing sent' if row.start is None else 'stopped'} within the {cap:g} s cap"
        log(f"    {row.note}; logs in {run.home}")
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        row.note = f"failed: {str(exc).splitlines()[0][:120]}"
        log(f"    {row.note}; logs in {run.home}")
    finally:
        run.close()
    if finished:  # the logs of a run that stopped early are kept
        shutil.rmtree(run.home, ignore_errors=True)
    return row


# -- reporting ---------------------------------------------------------------


def cell(value: float | None, fmt: str) -> str:
    """A table cell: ``value`` formatted, or a dash where it was not measured."""
    return "—" if value is None else format(value, fmt)


def label(row: Row) -> str:
    """The system of ``row``, and its store where that is not Redis."""
    return LABELS[row.system] + ("" if row.store == "redis" else f" ({row.store})")


def table(rows: list[Row]) -> str:
    lines = [
        "| system | N | setup s | start s | CPU s/s | RSS MB | store ops/s | late p50 s | "
        "late p99 s | max gap s | edit CPU s/replica | SIGTERM s | SIGKILL s | |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        cells = [
            cell(r.setup, ".1f"), cell(r.start, ".2f"), cell(r.cpu, ".3f"),
            cell(r.rss_mb, ".0f"), cell(r.ops, ".0f"), cell(r.late_p50, ".3f"),
            cell(r.late_p99, ".3f"), cell(r.max_gap, ".2f"), cell(r.edit_cpu, ".2f"),
            cell(r.sigterm, ".2f"),
            cell(r.sigkill, ".2f"),
        ]  # fmt: skip
        lines.append(f"| {label(r)} | {r.n:,} | " + " | ".join(cells) + f" | {r.note} |")
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    """celery-leader's rows in the four numbers a large schedule is judged by."""
    lines = [
        "| store | entries | N | first dispatch s | read all s | state loaded s | "
        "RSS B/entry | edit CPU ms/replica | idle CPU s/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.system not in ("leader", "leader-store"):
            continue
        per_entry = None if r.rss_mb is None else r.rss_mb * 1024 * 1024 / r.n
        edit = None if r.edit_cpu is None else r.edit_cpu * 1000
        where = "store" if r.system == "leader-store" else "code"
        cells = [
            cell(r.start, ".2f"), cell(r.read_all, ".1f"), cell(r.loaded, ".1f"),
            cell(per_entry, ".0f"),
            cell(edit, ".1f"), cell(r.cpu, ".3f"),
        ]  # fmt: skip
        lines.append(f"| {r.store} | {where} | {r.n:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def ratios(rows: list[Row]) -> str:
    """celery-leader's code entries against redbeat at the same N: above 1, ours costs more."""
    columns = ("start", "cpu", "rss_mb", "ops", "max_gap", "sigterm", "sigkill")
    names = ("start", "CPU", "RSS", "store ops/s", "max gap", "SIGTERM", "SIGKILL")
    redbeat = {r.n: r for r in rows if r.system == "redbeat"}
    lines = [
        "| N | " + " | ".join(names) + " |",
        "|---:|" + "---:|" * len(names),
    ]
    for ours in (r for r in rows if r.system == "leader" and r.n in redbeat):
        theirs = redbeat[ours.n]
        cells = []
        for column in columns:
            a, b = getattr(ours, column), getattr(theirs, column)
            cells.append("—" if a is None or not b else f"{a / b:.2f}x")
        lines.append(f"| {ours.n:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _numbers(text: str) -> list[int]:
    try:
        return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of whole numbers: {text!r}") from None


def _systems(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in SYSTEMS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}"
        )
    return names


def _stores(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in STORES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown store(s) {', '.join(unknown)}; choose from {', '.join(STORES)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--n",
        type=_numbers,
        default=[1_000, 10_000, 100_000],
        help="entry counts for every system (default 1000,10000,100000)",
    )
    parser.add_argument(
        "--store-n",
        type=int,
        default=1_000_000,
        help="one more, larger N for store entries only (0: none)",
    )
    parser.add_argument(
        "--only",
        type=_systems,
        default=list(SYSTEMS),
        help=f"systems to run (default {','.join(SYSTEMS)})",
    )
    parser.add_argument(
        "--store",
        type=_stores,
        default=["redis"],
        help=f"celery-leader's stores (default redis; choose from {','.join(STORES)})",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    parser.add_argument("--cap", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument(
        "--burst", type=int, default=100_000, help="entries due at once (0: no burst run)"
    )
    args = parser.parse_args(argv)  # fmt: skip

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # SIGTERM unwinds like Ctrl-C (which a shell's background job ignores), so the
    # servers and beats are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ours = ("leader", "leader-store")
    plan = [
        (s, n, store)
        for n in args.n
        for s in args.only
        for store in (args.store if s in ours else ["redis"])
    ]
    if args.store_n and "leader-store" in args.only and args.store_n not in args.n:
        plan += [("leader-store", args.store_n, store) for store in args.store]
    load = os.getloadavg()
    started = time.monotonic()
    pg = None
    if "django" in args.only:
        pg = PostgresServer()
        pg.start()
    try:
        rows = [run_one(s, n, args.seconds, args.cap, pg, log, store) for s, n, store in plan]
    finally:
        kill_all()
        if pg is not None:
            pg.close()
    if args.burst:
        log(f"  burst: {args.burst:,} entries due at once")
        bursts = burst.run(args.burst)
    print(
        f"_{datetime.date.today().isoformat()}, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.2f} at start and {os.getloadavg()[0]:.2f} at the end; "
        f"ttl {TTL:g} s, a {args.seconds:g} s window, at most {args.cap:g} s per run; "
        f"took {(time.monotonic() - started) / 60:.1f} min._\n"
    )
    print(table(rows))
    brief = summary(rows)
    if brief:
        print(f"\ncelery-leader, per store:\n\n{brief}")
    ratio = ratios(rows)
    if ratio:
        print(f"\ncelery-leader (code entries) over celery-redbeat at the same N:\n\n{ratio}")
    if args.burst:
        print(f"\n{burst.table(bursts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
