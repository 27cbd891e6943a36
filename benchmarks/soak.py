"""Soak: three beats and two workers on one Redis for hours, with faults, edits and reads.

    .venv/bin/python -m benchmarks.soak --hours 2
    .venv/bin/python -m benchmarks.soak --minutes 12 --fault-every 120 --warmup 3

What runs (``benchmarks/apps/soak_app.py``), on a redis-server started here on a
free loopback port (database 0: broker, lease store and run ledger, the ledger on
as by default; database 1: the record of runs):

* three ``celery beat -S celery_leader.LeaderScheduler`` replicas and two ``celery
  worker`` processes (prefork, two pool processes each), all at default settings
  (ttl 15 s, ``leader_missed_slots = "once"``);
* 200 entries in the store: 10 every second, 50 every 5 s, 60 every 30 s, 60 every
  minute, 10 on cron ``* * * * *`` and 10 on ``*/2 * * * *`` (about 23 slots a second);
* one entry's kwargs edited every minute through the Python API (``entries_of``),
  the entries in turn;
* a fault every ``--fault-every`` seconds (default 300), in turn: SIGKILL of the
  leader beat's process group, SIGTERM of it, SIGKILL of a worker's process group
  (the two in turn), ``celery leader resign``. A killed or stopped process is
  started again at once under a new instance id, as a supervisor would;
* ``celery leader status`` every 10 s, its time and exit code kept.

Every 30 s it samples the RSS and open fds of every process of each role (the
main process and, for workers, the pool), following restarts, notes which beat
leads, and Redis's key count (database 0) and ``used_memory``. A process's RSS
slope is taken after its warm-up: ``--warmup`` minutes after it was first seen
and, for a beat, :data:`LEADING_WARMUP` after it first led (a beat's RSS steps up
about 1 MB when it first leads, and a slope across that step reads it as growth),
over at least :data:`SLOPE_WINDOW` of samples.

What counts as sent and as run:

* **published**: the broker's own copy. The app publishes to a topic exchange;
  the benchmark binds a second queue to it, so Redis holds a copy of every
  message beat published, and a thread here empties that queue as it goes and
  keeps each message's ``leader_slot`` and ``leader_epoch``.
* **run**: the task's body pushes its slot to a list in database 1 each time it
  runs, emptied here as it goes.

The slots due are those of the entries' grids (interval entries on a grid of
their period since the Unix epoch, the two crons on whole minutes and even
minutes, UTC) from 5 s after the first message to 5 s before the end of the
faults; the run goes on 130 s more (a killed worker's messages come back after
the 30 s visibility timeout, and a slot no worker started is judged 5 s after its
entry's next slot is sent, 2 minutes at most here) before everything is stopped
with SIGTERM.

* **run twice**: slots whose body ran more than once. One explained by
  ``leader_on_redelivery = "rerun"`` (a worker killed while running the slot: the
  first run's process is one this benchmark killed) is shown apart.
* **published twice**: slots the broker got more than once. The ledger's re-send
  (a new term sends again a slot the killed leader claimed and may not have
  published) does this by design and the workers run it once; a slot published
  twice under one epoch counts as twice, unless a beat logged that it sent it again
  because no worker had started it (``re-sending slot S (epoch E): ...``, a
  message the broker lost), shown apart. A killed worker's
  unacknowledged message, which Redis puts back in every queue bound to the
  exchange (the copy too), keeps its task id: it is shown as put back by the
  broker, not as a second publish.
* **lost**: slots due that never ran. Those the missed-slot policy dropped are
  explained by the beats' own lines ``not sending N missed slot(s) of 'E', the
  last due D``: the N slots of E before D; and ``not sending slot S again: it has
  not started, and slot T of its entry, sent after it, has started``: a slot whose
  message the broker lost, missed under the default policy. The rest are
  unexplained.

The exit code is 1 when a slot was run twice (unexplained), published twice
under one epoch, or lost unexplained, or when a step of the benchmark itself (a
sample, a fault) raised: it is shown and the run goes on.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from kombu import Connection, Queue

from celery_leader.backends import open_store
from celery_leader.celery.entries import entries_of
from celery_leader.settings.config import LeaderConfig
from harness.groups import session_members
from harness.procs import Proc
from harness.procs import start as start_process
from harness.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
CELERY = Path(sys.executable).with_name("celery")
APP = "benchmarks.apps.soak_app"
TASK = "soak.run"
#: (name prefix, how many, seconds between slots, cron expression or None).
MIX = [
    ("s1-", 10, 1, None),
    ("s5-", 50, 5, None),
    ("s30-", 60, 30, None),
    ("m1-", 60, 60, None),
    ("cron1-", 10, 60, "* * * * *"),
    ("cron2-", 10, 120, "*/2 * * * *"),
]
FAULTS = ["sigkill-leader", "sigterm-leader", "sigkill-worker", "resign"]
DROPPED = re.compile(
    r"not sending (\d+) missed slot\(s\) of '([^']+)', the last due (\S+) \(leader_missed_slots"
)
#: A slot a beat judged lost by the broker, after a later slot of its entry started.
NOT_AGAIN = re.compile(r"not sending slot (\S+) again: it has not started")
RESENT = re.compile(r"re-sending slot (\S+) \(epoch \d+\): (?:slot \S+ of its|no worker)")
#: After the faults end: a killed worker's messages come back after the app's
#: 30 s visibility timeout; a slot no worker started is judged 5 s after its
#: entry's next slot is sent (``start_watch.LATER_START``), 2 minutes at most here.
DRAIN = 130.0
EDGE = 5.0  # seconds cut off both ends of the counted window
#: A beat's warm-up after it first led: its RSS steps up as it loads the state and
#: opens the publisher's connections, within seconds of its promotion.
LEADING_WARMUP = 120.0
#: The shortest stretch of warm samples a slope is taken over: over less, a 0.1 MB
#: step of the allocator reads as more than 0.5 MB an hour.
SLOPE_WINDOW = 600.0


def _now() -> float:
    return time.time()


def _utc(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%H:%M:%S")


def _utc_ms(ts: float) -> str:
    """To the millisecond: whether a fault came before or after a slot's publish."""
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def _due(slot: str) -> tuple[str, float]:
    entry, _, when = slot.rpartition("@")
    return entry, datetime.datetime.fromisoformat(when).timestamp()


@dataclass
class Role:
    """One role (``beat1``, ``worker2``...): the process that fills it now, restarts included."""

    name: str
    argv: list[str]
    proc: Proc | None = None
    instance: str = ""
    generation: int = 0
    #: Every pid that ever belonged to this role's process groups (for the rerun rule).
    pids: set[int] = field(default_factory=set)


class Soak:
    """The servers, processes, threads and measurements of one soak run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = Path(tempfile.mkdtemp(prefix="celery-leader-soak-"))
        self.redis = RedisServer()
        self.stop = threading.Event()  # the status loop's
        self.done = threading.Event()  # the collector's: every process has stopped
        self.lock = threading.Lock()
        #: slot -> (epoch, arrival time, task id) of each copy the broker got.
        self.published: dict[str, list[tuple[int, float, str]]] = collections.defaultdict(list)
        self.runs: dict[str, list[int]] = collections.defaultdict(list)
        self.first_message: float | None = None
        self.samples: list[tuple[float, str, int, float, int]] = []  # t, role, pid, MB, fds
        self.first_seen: dict[int, float] = {}
        self.first_led: dict[int, float] = {}  # beat pid -> the first sample it led at
        self.store_samples: list[tuple[float, int, float]] = []  # t, keys, used MB
        self.status: list[tuple[float, float, int]] = []  # t, seconds, exit code
        self.faults: list[dict[str, Any]] = []
        self.edits = [0, 0]  # done, failed
        self.errors: list[str] = []  # what went wrong in the benchmark's own steps
        self.killed_pids: set[int] = set()
        self.roles: dict[str, Role] = {}

    # -- processes -------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {
            "BROKER_URL": self.redis.url,
            "RUNS_URL": self.runs_url,
            "PYTHONPATH": str(ROOT),
        }

    @property
    def runs_url(self) -> str:
        return self.redis.url.rpartition("/")[0] + "/1"

    def spawn(self, role: Role) -> None:
        role.generation += 1
        role.instance = f"{role.name}-{role.generation}"
        env = {**self.env(), "INSTANCE_ID": role.instance}
        argv = [a.replace("{instance}", role.instance) for a in role.argv]
        role.proc = start_process(
            argv, env=env, cwd=self.dir, log_path=self.dir / f"{role.instance}.log"
        )
        role.pids.add(role.proc.pid)

    def ready(self, role: Role) -> None:
        assert role.proc is not None
        pattern = r"beat: Starting\.\.\." if role.name.startswith("beat") else r"ready\."
        role.proc.wait_for_line(pattern, timeout=120)

    def session_pids(self, role: Role) -> list[int]:
        """The role's process and everything it forked (one session each)."""
        return [] if role.proc is None else session_members(role.proc.pid)

    def signal_role(self, role: Role, sig: int) -> float:
        """Send ``sig`` to the role's process group, wait for it to end, start it again;
        when the signal was sent."""
        assert role.proc is not None
        pids = self.session_pids(role)
        if sig == signal.SIGKILL:
            self.killed_pids.update(pids)
        sent = _now()
        role.proc.signal(sig)
        try:
            role.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            print(f"{role.instance} did not stop in 60 s after {sig}; killing it", flush=True)
            role.proc.kill_group()
        self.spawn(role)
        return sent

    # -- threads ---------------------------------------------------------------------

    def collect(self) -> None:
        """Empty the copy queue and the runs list as they fill."""
        broker = redis.Redis.from_url(self.redis.url)
        runs = redis.Redis.from_url(self.runs_url)
        try:
            while True:
                stopping = self.done.is_set()
                try:
                    got = self.drain_once(broker, runs)
                except Exception as exc:  # shown and counted: a dead collector would hide slots
                    self.errors.append(f"collector: {exc!r}")
                    print(f"collector: {exc!r}", flush=True)
                    time.sleep(1)
                    continue
                if stopping and not got:
                    return
                if not got:
                    time.sleep(0.5)
        finally:
            broker.close()
            runs.close()

    def drain_once(self, broker: redis.Redis[bytes], runs: redis.Redis[bytes]) -> int:
        copies = broker.lpop("soak.copy", 1000) or []
        ran = runs.lpop("soak:runs", 1000) or []
        now = _now()
        with self.lock:
            for raw in copies:
                headers = json.loads(raw)["headers"]
                slot = headers.get("leader_slot")
                if slot is None:
                    continue
                if self.first_message is None:
                    self.first_message = now
                self.published[slot].append((int(headers["leader_epoch"]), now, headers["id"]))
            for raw in ran:
                slot, _node, pid = json.loads(raw)
                self.runs[slot].append(int(pid))
        return len(copies) + len(ran)

    def status_loop(self) -> None:
        while not self.stop.wait(self.args.status_every):
            began = time.monotonic()
            try:
                done = subprocess.run(
                    [str(CELERY), "-A", APP, "leader", "status"],
                    env={**os.environ, **self.env()},
                    cwd=self.dir,
                    capture_output=True,
                    timeout=120,
                    check=False,
                )
                code = done.returncode
            except subprocess.TimeoutExpired:
                code = -1
            self.status.append((_now(), time.monotonic() - began, code))

    # -- the run ---------------------------------------------------------------------

    def add_entries(self) -> list[str]:
        from benchmarks.apps.soak_app import app  # reads BROKER_URL when imported

        self.entries = entries_of(app)
        names = []
        for prefix, count, every, cron in MIX:
            for i in range(count):
                name = f"{prefix}{i}"
                if cron is None:
                    self.entries.add(name, TASK, every=every, who="soak")
                else:
                    self.entries.add(name, TASK, cron=cron, who="soak")
                names.append(name)
        return names

    def leader(self) -> Role | None:
        holder = self.store.lock.holder("beat")
        if holder is None:
            return None
        for role in self.roles.values():
            if role.instance == holder.instance_id:
                return role
        return None

    def epoch(self) -> int:
        holder = self.store.lock.holder("beat")
        return 0 if holder is None else holder.epoch

    def fault(self, n: int) -> None:
        kind = FAULTS[n % len(FAULTS)]
        record: dict[str, Any] = {"t": _now(), "kind": kind, "epoch_before": self.epoch()}
        if kind == "sigkill-worker":
            role = self.roles[f"worker{n // len(FAULTS) % 2 + 1}"]
            record["target"] = role.instance
            record["signalled"] = self.signal_role(role, signal.SIGKILL)
        elif kind == "resign":
            done = subprocess.run(
                [str(CELERY), "-A", APP, "leader", "resign"],
                env={**os.environ, **self.env()},
                cwd=self.dir,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            said = " / ".join(done.stdout.split("\n")).strip(" /")
            record["target"] = f"exit {done.returncode}: {said}"
        else:
            role = self.leader()
            if role is None:
                record["target"] = "no leader"
            else:
                record["target"] = role.instance
                sig = signal.SIGKILL if kind == "sigkill-leader" else signal.SIGTERM
                record["signalled"] = self.signal_role(role, sig)
        self.faults.append(record)
        print(f"{_utc_ms(record['t'])} fault {kind}: {record['target']}", flush=True)

    def edit(self, n: int, names: list[str]) -> None:
        name = names[n % len(names)]
        try:
            self.entries.update(name, kwargs={"edit": n}, why="soak edit", who="soak")
            self.edits[0] += 1
        except Exception as exc:  # counted and shown: the run goes on
            self.edits[1] += 1
            print(f"edit of {name} failed: {exc!r}", flush=True)

    def sample(self) -> None:
        t = _now()
        leading = self.leader()
        if leading is not None and leading.proc is not None:
            self.first_led.setdefault(leading.proc.pid, t)
        for role in self.roles.values():
            for pid in self.session_pids(role):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    fds = len(os.listdir(f"/proc/{pid}/fd"))
                except OSError:
                    continue
                found = re.search(r"VmRSS:\s+(\d+) kB", status)
                if found is None:
                    continue
                self.first_seen.setdefault(pid, t)
                name = role.name if role.proc and pid == role.proc.pid else f"{role.name} pool"
                self.samples.append((t, name, pid, int(found.group(1)) / 1024, fds))
        with self.redis.client() as client:
            memory = client.info("memory")["used_memory"] / 2**20
            self.store_samples.append((t, int(client.dbsize()), memory))

    def run(self) -> int:
        args = self.args
        load_start = os.getloadavg()
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        print(f"commit {commit}; load at start {_load(load_start)}; logs in {self.dir}")
        self.redis.start()
        os.environ.update(self.env())  # the app reads BROKER_URL when imported
        threads = [threading.Thread(target=self.collect, daemon=True)]
        try:
            with Connection(self.redis.url) as conn:
                from benchmarks.apps.soak_app import COPY_QUEUE, EXCHANGE, QUEUE

                Queue(COPY_QUEUE, EXCHANGE, routing_key=QUEUE).bind(conn.default_channel).declare()
            names = self.add_entries()
            self.store = open_store(LeaderConfig.from_mapping({"leader_url": self.redis.url}))
            celery = [str(CELERY), "-A", APP]
            for i in (1, 2):
                self.roles[f"worker{i}"] = Role(
                    f"worker{i}",
                    [*celery, "worker", "-P", "prefork", "-c", "2", "-n", "{instance}@%h",
                     "-l", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"],
                )  # fmt: skip
            for i in (1, 2, 3):
                self.roles[f"beat{i}"] = Role(
                    f"beat{i}",
                    [*celery, "beat", "-S", "celery_leader.LeaderScheduler", "-l", "INFO",
                     "-s", str(self.dir / "beat-{instance}")],
                )  # fmt: skip
            threads[0].start()
            for role in self.roles.values():
                self.spawn(role)
            for role in self.roles.values():
                self.ready(role)
            threads.append(threading.Thread(target=self.status_loop, daemon=True))
            threads[1].start()
            start = time.monotonic()
            end = start + args.seconds
            events = {"sample": start, "edit": start + 60, "fault": start + args.fault_every}
            counts = {"sample": 0, "edit": 0, "fault": 0}
            while True:
                kind, when = min(events.items(), key=lambda kv: kv[1])
                if when > end:
                    break
                time.sleep(max(0.0, when - time.monotonic()))
                every = {"sample": args.sample_every, "edit": args.edit_every}
                events[kind] += every.get(kind, args.fault_every)
                try:
                    if kind == "sample":
                        self.sample()
                    elif kind == "edit":
                        self.edit(counts[kind], names)
                    else:
                        self.fault(counts[kind])
                except Exception as exc:  # shown and counted: one step must not end the run
                    self.errors.append(f"{kind}: {exc!r}")
                    print(f"{kind}: {exc!r}", flush=True)
                counts[kind] = counts.get(kind, 0) + 1
            time.sleep(max(0.0, end - time.monotonic()))
            window_end = _now() - EDGE
            time.sleep(DRAIN)
            self.sample()
        finally:
            self.shutdown(threads)
        load_end = os.getloadavg()
        failed = self.report(window_end, names)
        print(f"\ncommit {commit}; load at start {_load(load_start)}, at end {_load(load_end)}")
        return 1 if failed else 0

    def shutdown(self, threads: list[threading.Thread]) -> None:
        """SIGTERM every beat, then every worker (warm shutdown), then stop the collector
        once it has emptied the queues."""
        self.stop.set()
        for prefix in ("beat", "worker"):
            for role in self.roles.values():
                if role.name.startswith(prefix) and role.proc is not None and role.proc.alive:
                    role.proc.signal(signal.SIGTERM)
            for role in self.roles.values():
                if role.name.startswith(prefix) and role.proc is not None:
                    try:
                        role.proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        print(f"{role.instance} did not stop in 60 s; killed", flush=True)
                    role.proc.kill_group()
        self.done.set()
        for thread in threads:
            if thread.is_alive():
                thread.join(timeout=150)
        if hasattr(self, "store"):
            self.store.close()
        if hasattr(self, "entries"):
            self.entries.close()
        self.redis.close()  # stops it and removes its data directory

    # -- the report ------------------------------------------------------------------

    def dropped_by_policy(self) -> set[tuple[str, float]]:
        """(entry, due) of every slot a beat said it dropped as missed."""
        every = {f"{p}{i}": e for p, n, e, _ in MIX for i in range(n)}
        dropped = set()
        for log in self.dir.glob("beat*.log"):
            text = log.read_text(errors="replace")
            for found in DROPPED.finditer(text):
                count, entry, due = int(found.group(1)), found.group(2), found.group(3)
                last = datetime.datetime.fromisoformat(due).timestamp()
                for k in range(1, count + 1):
                    dropped.add((entry, round(last - k * every[entry], 3)))
            dropped.update(_due(found.group(1)) for found in NOT_AGAIN.finditer(text))
        return dropped

    def resent_unstarted(self) -> set[str]:
        """Slots a beat sent again because no worker had started them."""
        return {
            found.group(1)
            for log in self.dir.glob("beat*.log")
            for found in RESENT.finditer(log.read_text(errors="replace"))
        }

    def report(self, window_end: float, names: list[str]) -> bool:
        if self.first_message is None:
            print("no message was published")
            return True
        window_start = self.first_message + EDGE
        due: set[tuple[str, float]] = set()
        for prefix, count, every, _ in MIX:
            first = math.ceil(window_start / every) * every
            for i in range(count):
                for t in range(first, math.floor(window_end / every) * every + 1, every):
                    due.add((f"{prefix}{i}", float(t)))
        by_due = {_due(slot): slot for slot in (*self.published, *self.runs)}
        ran = {key for key, slot in by_due.items() if slot in self.runs}
        published = {key for key, slot in by_due.items() if slot in self.published}
        lost = due - ran
        policy = self.dropped_by_policy()
        explained = {key for key in lost if key in policy}
        lost_published = {key for key in lost - explained if key in published}
        unexplained = lost - explained
        in_window = [by_due[key] for key in due if key in by_due]
        twice_ran = [s for s in in_window if len(self.runs.get(s, [])) > 1]
        rerun = [s for s in twice_ran if set(self.runs[s][:-1]) & self.killed_pids]
        # A message the broker puts back (a killed worker's unacknowledged one) reaches
        # every bound queue again, the copy too, with its task id: one publish.
        publishes = {s: {i: e for e, _, i in self.published.get(s, [])} for s in in_window}
        restored = [s for s in in_window if len(self.published.get(s, [])) > len(publishes[s])]
        twice_pub = [s for s in in_window if len(publishes[s]) > 1]
        unstarted = self.resent_unstarted()
        resent = [s for s in twice_pub if s in unstarted]
        same_epoch = [
            s
            for s in twice_pub
            if len(set(publishes[s].values())) < len(publishes[s]) and s not in unstarted
        ]
        twice = len(twice_ran) - len(rerun) + len(same_epoch)

        span = (window_end - window_start) / 60
        print(f"\n## Slots ({span:.1f} min counted, {_utc(window_start)}-{_utc(window_end)} UTC)")
        print("| slots due | ran once | run twice | of which rerun after a killed worker "
              "| published twice | of which re-sent, not started | of which under one epoch "
              "| put back by the broker | lost | dropped by the policy "
              "| lost unexplained (of which published) |")  # fmt: skip
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        once = sum(1 for key in due if key in by_due and len(self.runs.get(by_due[key], [])) == 1)
        print(f"| {len(due)} | {once} | {len(twice_ran)} | {len(rerun)} | {len(twice_pub)} "
              f"| {len(resent)} | {len(same_epoch)} | {len(restored)} | {len(lost)} "
              f"| {len(explained)} "
              f"| {len(unexplained)} ({len(lost_published)}) |")  # fmt: skip
        for key in sorted(unexplained, key=lambda k: k[1])[:20]:
            print(f"  unexplained: {key[0]} due {_utc_ms(key[1])}, published {key in published}"
                  f"{self.nearest_signal(key[1])}")  # fmt: skip
        for slot in [*twice_ran, *same_epoch][:20]:
            print(f"  twice: {slot} runs by pids {self.runs.get(slot)}, "
                  f"published {self.published.get(slot)}")  # fmt: skip
        self.report_faults()
        self.report_processes()
        self.report_store()
        if self.errors:
            print(f"\n{len(self.errors)} step(s) of the benchmark failed: {self.errors[:5]}")
        return twice > 0 or len(unexplained) > 0 or bool(self.errors)

    def nearest_signal(self, due: float) -> str:
        """The signal sent nearest to ``due``, to the millisecond: a worker killed as the
        slot was published may have taken its message off the queue with it (kombu's
        Redis transport pops a message, then records it as unacknowledged)."""
        sent = [f for f in self.faults if "signalled" in f]
        if not sent:
            return ""
        fault = min(sent, key=lambda f: abs(f["signalled"] - due))
        offset = fault["signalled"] - due
        return (f"; nearest signal: {fault['kind']} of {fault['target']} at "
                f"{_utc_ms(fault['signalled'])}, {offset:+.3f} s from the due time")  # fmt: skip

    def report_faults(self) -> None:
        print("\n## Faults")
        print("| signalled (UTC) | fault | target | first publish of a newer epoch after it, s |")
        print("|---|---|---|---:|")
        firsts: dict[int, float] = {}
        for sends in self.published.values():
            for epoch, t, _ in sends:
                firsts[epoch] = min(t, firsts.get(epoch, t))
        for fault in self.faults:
            later = [t for e, t in firsts.items() if e > fault["epoch_before"] and t >= fault["t"]]
            gap = f"{min(later) - fault['t']:.1f}" if later else "—"
            if fault["kind"] == "sigkill-worker":
                gap = "—"
            at = _utc_ms(fault.get("signalled", fault["t"]))
            print(f"| {at} | {fault['kind']} | {fault['target']} | {gap} |")
        times = [s for _, s, _ in self.status]
        failed = sum(1 for *_, code in self.status if code != 0)
        if times:
            print(f"\n`leader status`: {len(times)} runs, {failed} failed, "
                  f"median {statistics.median(times):.2f} s, max {max(times):.2f} s; "
                  f"edits: {self.edits[0]} done, {self.edits[1]} failed")  # fmt: skip

    def report_processes(self) -> None:
        warmup = self.args.warmup * 60
        print(f"\n## Processes (RSS slope: least squares over the samples from "
              f"{self.args.warmup:g} min after the process was first seen and "
              f"{LEADING_WARMUP / 60:g} min after a beat first led, "
              f"when they span {SLOPE_WINDOW / 60:g} min or more)")  # fmt: skip
        print("| role | pid | seen (UTC) | samples | RSS first / last, MB "
              "| RSS slope, MB/h | fds first / last |")  # fmt: skip
        print("|---|---:|---|---:|---:|---:|---:|")
        rows: dict[tuple[str, int], list[tuple[float, float, int]]] = collections.defaultdict(list)
        for t, role, pid, mb, fds in self.samples:
            rows[(role, pid)].append((t, mb, fds))
        for (role, pid), got in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[1][0][0])):
            warm_from = self.first_seen[pid] + warmup
            if pid in self.first_led:
                warm_from = max(warm_from, self.first_led[pid] + LEADING_WARMUP)
            warm = [(t, mb) for t, mb, _ in got if t >= warm_from]
            slope = "—"
            if len(warm) >= 3 and warm[-1][0] - warm[0][0] >= SLOPE_WINDOW:
                slope = f"{_slope(warm):+.2f}"
            print(f"| {role} | {pid} | {_utc(got[0][0])}-{_utc(got[-1][0])} | {len(got)} "
                  f"| {got[0][1]:.1f} / {got[-1][1]:.1f} | {slope} "
                  f"| {got[0][2]} / {got[-1][2]} |")  # fmt: skip

    def report_store(self) -> None:
        print("\n## Store (Redis database 0: broker, store, ledger)")
        print("| at (UTC) | minutes | keys | used_memory, MB |")
        print("|---|---:|---:|---:|")
        got = self.store_samples
        step = max(1, len(got) // 8)
        for t, keys, mb in [*got[::step][:8], got[-1]]:
            print(f"| {_utc(t)} | {(t - got[0][0]) / 60:.0f} | {keys} | {mb:.1f} |")
        slots = sum(len(runs) for runs in self.runs.values())
        grown = (got[-1][2] - got[0][2]) * 2**20
        print(
            f"\nGrowth: {grown / 2**20:.1f} MB over {slots} slots run, "
            f"{grown / max(slots, 1):.0f} B a slot (the ledger keeps a record per slot "
            "for leader_ledger_retention, two days, or the newest leader_ledger_keep, "
            "10,000, of an entry)."
        )


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB per hour."""
    mean_t = statistics.fmean(t for t, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    num = sum((t - mean_t) * (y - mean_y) for t, y in points)
    den = sum((t - mean_t) ** 2 for t, _ in points)
    return num / den * 3600


def _load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--hours", type=float, help="how long the faults run (default 2)")
    length.add_argument("--minutes", type=float, help="the same in minutes, for short runs")
    parser.add_argument("--fault-every", type=float, default=300, help="seconds between faults")
    parser.add_argument("--edit-every", type=float, default=60, help="seconds between edits")
    parser.add_argument("--status-every", type=float, default=10, help="seconds between status")
    parser.add_argument("--sample-every", type=float, default=30, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=10, help="minutes before RSS slopes")
    args = parser.parse_args()
    minutes = args.minutes if args.minutes is not None else (args.hours or 2) * 60
    args.seconds = minutes * 60
    sys.exit(Soak(args).run())


if __name__ == "__main__":
    main()
