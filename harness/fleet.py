"""Scheduler replicas on a :class:`~harness.fakeclock.FakeClock`, and what they sent.

Real ``celery beat`` and Dramatiq schedulers running tests/apps/clock_app.py and
clock_dramatiq.py, for tests/test_fake_clock.py and benchmarks/dst_compare.py.

Nothing consumes the broker's queues, so the messages there are every slot sent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import redis

from celery_leader.backends import HolderInfo, open_store
from celery_leader.settings.config import LeaderConfig
from harness.fakeclock import FakeClock
from harness.procs import Proc, Procs
from harness.procs import start as start_process
from harness.waiting import wait_for

PYTHON = Path(sys.executable)
CELERY = PYTHON.with_name("celery")
REPO = Path(__file__).resolve().parents[1]
TTL = 3.0
#: Settings of replicas that schedule on their own fake clocks, months off the
#: store's real one and racing through days: skew must not keep them from
#: leading (1e9 s: 31 years).
OWN_CLOCK = {"CELERY_LEADER_CLOCK": "local", "CELERY_LEADER_MAX_CLOCK_SKEW": "1e9"}


@dataclass(frozen=True)
class Sent:
    entry: str
    due: datetime  # UTC, read from the slot name
    slot: str
    epoch: int


def parse_slot(slot: str) -> tuple[str, datetime]:
    entry, _, when = slot.rpartition("@")
    return entry, datetime.fromisoformat(when).astimezone(timezone.utc)


class Fleet:
    """Scheduler replicas of one framework sharing a broker and a lease store."""

    def __init__(
        self,
        kind: str,
        procs: Procs,
        clock: FakeClock,
        redis_url: str,
        db: int,
        env: dict[str, str] | None = None,
        leader_url: str | None = None,
    ) -> None:
        #: "beat", "dramatiq" or "persistent" (Celery's own PersistentScheduler).
        self.kind = kind
        self.procs = procs
        self.clock = clock
        self.db = db
        server = redis_url.rpartition("/")[0]
        self.broker_url = f"{server}/{db}"
        #: The lease store: ``leader_url``, else database ``db + 1`` of the broker's Redis.
        self.leader_url = leader_url or f"{server}/{db + 1}"
        self.env = env or {}
        self.replicas: dict[str, tuple[Proc, str]] = {}  # instance -> (process, clock name)
        self._spawned = 0
        self._store = open_store(LeaderConfig.from_env({"CELERY_LEADER_URL": self.leader_url}))

    def argv(self) -> list[str]:
        if self.kind == "dramatiq":
            return [str(PYTHON), "-m", "celery_leader.dramatiq", "tests.apps.clock_dramatiq"]
        beat = [str(CELERY), "-A", "tests.apps.clock_app", "beat", "-l", "info"]
        if self.kind == "persistent":  # its shelve file, away from the repository
            return [
                *beat,
                "-s",
                str(self.procs.log_dir / f"celerybeat-schedule-{self.db}-{self._spawned}"),
            ]
        return [*beat, "-S", "leader"]

    def start(self, clock: str = "main") -> str:
        """Start a replica on ``clock``; returns its instance id once it runs."""
        instance = self.spawn(clock)
        self.ready(instance)
        return instance

    def spawn(self, clock: str = "main") -> str:
        """Start a replica on ``clock`` and return its instance id at once."""
        self._spawned += 1
        # Unique per store, so that fleets of one kind on two clocks keep their logs apart.
        instance = f"{self.kind}{self._spawned}-{clock}-{self.db}"
        proc = start_process(
            self.argv(),
            log_path=self.procs.log_dir / f"{instance}.log",
            env={
                **self.clock.env(clock),
                **self.env,
                "BROKER_URL": self.broker_url,
                "LEADER_URL": self.leader_url,
                "LEADER_TTL": str(TTL),
                "INSTANCE_ID": instance,
                "CELERY_LEADER_INSTANCE_ID": instance,
            },
            cwd=REPO,
        )
        self.procs.started.append(proc)  # killed at teardown
        self.replicas[instance] = (proc, clock)
        return instance

    def ready(self, instance: str) -> None:
        """Wait until replica ``instance`` runs its scheduler."""
        ready = "joins" if self.kind == "dramatiq" else r"beat: Starting\.\.\."
        self.proc(instance).wait_for_line(ready, timeout=30)

    def holder(self) -> HolderInfo | None:
        return self._store.lock.holder("beat")

    def store_time(self) -> float:
        """The lease store's clock now (seconds since the epoch; one round trip)."""
        now = self._store.lock.store_time("beat")
        assert now is not None, f"{self.leader_url} has no clock"
        return now

    def leader(self, newer_than: int = 0, timeout: float = TTL + 10) -> tuple[str, int]:
        """Instance and epoch of the holder (waits for one with an epoch above ``newer_than``)."""

        def found() -> tuple[str, int] | None:
            info = self.holder()
            if info is None or info.epoch <= newer_than or info.instance_id not in self.replicas:
                return None
            return info.instance_id, info.epoch

        return wait_for(found, timeout, interval=0.02, message=f"a new {self.kind} leader")

    def signal_leader(self, sig: int) -> tuple[str, int]:
        """Send ``sig`` to the leader's process group; returns its instance and epoch."""
        old, epoch = self.leader()
        self.proc(old).signal(sig)
        return old, epoch

    def replace(self, old: str, epoch: int) -> tuple[str, int]:
        """Wait for the leader after ``old`` (epoch above ``epoch``) and start a replacement
        of ``old`` on its clock; returns the new leader and its epoch."""
        new, new_epoch = self.leader(newer_than=epoch)
        self.spawn(self.replicas[old][1])
        return new, new_epoch

    def proc(self, instance: str) -> Proc:
        return self.replicas[instance][0]

    def stop(self) -> None:
        for proc, _ in self.replicas.values():
            proc.signal(signal.SIGTERM)
        for proc, _ in self.replicas.values():
            proc.wait(timeout=30)
        self._store.close()

    def sent(self) -> list[Sent]:
        """Every slot in the broker, in the order sent."""
        with redis.Redis.from_url(self.broker_url) as client:
            if self.kind == "dramatiq":
                ids = client.lrange("dramatiq:ticks", 0, -1)
                raws = client.hmget("dramatiq:ticks.msgs", ids) if ids else []
                options = [json.loads(raw)["options"] for raw in raws if raw]
            else:  # kombu LPUSHes: the oldest message is last
                raws = list(reversed(client.lrange("celery", 0, -1)))
                options = [json.loads(raw)["headers"] for raw in raws]
        found = []
        for opts in options:
            slot = opts.get("leader_slot")
            if slot is None:  # Celery's PersistentScheduler names no slot
                continue
            entry, due = parse_slot(slot)
            found.append(Sent(entry, due, slot, int(opts["leader_epoch"])))
        return found

    def plan(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """``leader plan --json`` of this fleet's app over ``(start, end]``, run as a user would."""
        window = ["--from", start.isoformat(), "--to", end.isoformat(), "--json"]
        if self.kind == "dramatiq":
            argv = [str(PYTHON), "-m", "celery_leader", "plan", "tests.apps.clock_dramatiq"]
        else:
            argv = [str(CELERY), "-A", "tests.apps.clock_app", "leader", "plan"]
        env = {**self.env, "BROKER_URL": self.broker_url, "LEADER_URL": self.leader_url}
        done = subprocess.run(
            [*argv, *window],
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        slots: list[dict[str, Any]] = json.loads(done.stdout)["slots"]
        return slots


def duplicates(sent: list[Sent]) -> tuple[list[str], list[tuple[str, datetime]]]:
    """Slot names sent more than once, and (entry, due instant) pairs sent more than once."""
    names = [s for s, n in Counter(x.slot for x in sent).items() if n > 1]
    dues = [k for k, n in Counter((x.entry, x.due) for x in sent).items() if n > 1]
    return names, dues


def minutes(start: datetime, end: datetime, step: int = 1) -> list[datetime]:
    """Every ``step``-minute boundary in ``(start, end]``."""
    first = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    out = []
    moment = first
    while moment <= end:
        if moment.minute % step == 0:
            out.append(moment)
        moment += timedelta(minutes=1)
    return out
