"""The quickstart: three beat replicas and a worker, a leader killed, nothing sent twice.

Run from a fresh clone with ``bash scripts/quickstart.sh`` (it sets up the venv).
By default everything is embedded: Celery's filesystem transport as broker and
a ``file://`` lease store in a temporary folder, so no server is needed. Give
``--leader-url redis://...`` / ``postgresql://...`` and ``--broker-url`` to run
the same demo against real servers.

What it shows, as a live timeline: who leads (and with which epoch), every
slot the worker ran with the epoch beat stamped on it, the leader killed with
SIGKILL and later stopped with SIGTERM, the measured hand-over gaps, and the
tally "N slots, 0 sent twice". It exits 0 when no slot was sent twice and both
hand-overs happened, 1 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
CELERY = [sys.executable, "-m", "celery", "-A", "proj"]


class Demo:
    """Drives the processes and prints the timeline."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data = Path(tempfile.mkdtemp(prefix="celery-leader-demo-"))
        self.env = dict(
            os.environ,
            PYTHONPATH=str(HERE),
            DJANGO_SETTINGS_MODULE="proj.settings",
            DEMO_DATA=str(self.data),
            DEMO_EVERY=str(args.every),
            CELERY_LEADER_TTL=str(args.ttl),
        )
        if args.leader_url:
            self.env["CELERY_LEADER_URL"] = args.leader_url
        if args.broker_url:
            self.env["CELERY_BROKER_URL"] = args.broker_url
        self.t0 = time.monotonic()
        self.beats: dict[str, subprocess.Popen[bytes]] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ledger_pos = 0
        self.runs: list[dict[str, object]] = []
        self.leader: tuple[str, int] | None = None
        self.holders: dict[int, str] = {}  # epoch -> instance

        os.environ.update(self.env)  # the status probe below reads the same settings
        sys.path.insert(0, str(HERE))
        from proj.celery import app

        from celery_leader.backends import open_store
        from celery_leader.settings.config import LeaderConfig

        self.config = LeaderConfig.from_app(app)
        self.store = open_store(self.config)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.2f}s] {text}", flush=True)

    def spawn(self, name: str, *argv: str, instance: str | None = None) -> subprocess.Popen[bytes]:
        env = dict(self.env, CELERY_LEADER_INSTANCE_ID=instance or name)
        log = open(self.data / f"{name}.log", "wb")  # closed when the demo exits
        proc = subprocess.Popen([*CELERY, *argv], env=env, cwd=HERE, stdout=log, stderr=log)
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        self.say(f"lease store: {self.config.display_url}  (ttl {self.config.ttl:g} s)")
        self.say(f"work dir: {self.data}")
        self.spawn("worker", "worker", "-P", "solo", "-l", "warning", "-n", "demo-worker@%h")
        for n in (1, 2, 3):
            name = f"beat-{n}"
            self.beats[name] = self.spawn(name, "beat", "-S", "leader", "-l", "info")
            self.say(f"started {name} (pid {self.beats[name].pid})")

    def poll(self) -> None:
        """Print leadership changes and new runs from the worker's ledger."""
        info = self.store.lock.holder(self.config.beat_election)
        now = None if info is None else (info.instance_id, info.epoch)
        if now != self.leader:
            if now is None:
                self.say("nobody leads")
            else:
                self.holders[now[1]] = now[0]
                self.say(f"LEADER {now[0]} (epoch {now[1]})")
            self.leader = now
        ledger = self.data / "ledger.jsonl"
        if not ledger.exists():
            return
        with ledger.open() as f:
            f.seek(self.ledger_pos)
            for line in f:
                if not line.endswith("\n"):
                    break
                self.ledger_pos += len(line)
                run = json.loads(line)
                self.runs.append(run)
                sender = self.holders.get(run["epoch"], "?")
                self.say(f"  ran {run['slot']}  sent by {sender} (epoch {run['epoch']})")

    def run_until(self, deadline: float) -> None:
        while time.monotonic() - self.t0 < deadline:
            self.poll()
            time.sleep(0.05)

    def wait_for_leader(self, timeout: float) -> tuple[str, int]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.poll()
            if self.leader is not None:
                return self.leader
            time.sleep(0.02)
        raise SystemExit("no leader was elected: see the beat logs in " + str(self.data))

    def fail_over(self, how: signal.Signals, run_for: float) -> float:
        """Stop the leader with ``how``; return the measured gap in slots' due times."""
        name, epoch = self.wait_for_leader(self.config.ttl * 3)
        before = len(self.runs)
        self.say(f">>> {how.name} to the leader {name} (pid {self.beats[name].pid})")
        self.beats[name].send_signal(how)
        killed_at = time.monotonic()
        end = killed_at + self.config.ttl * 3 + 5
        while time.monotonic() < end:
            self.poll()
            if self.leader is not None and self.leader[1] > epoch:
                break
            time.sleep(0.02)
        else:
            raise SystemExit(f"no new leader after {how.name}: see logs in {self.data}")
        took = time.monotonic() - killed_at
        self.say(f">>> {self.leader[0]} took over in {took:.2f} s (epoch {self.leader[1]})")
        self.run_until(time.monotonic() - self.t0 + run_for)
        gap = _largest_gap(self.runs[max(0, before - 1) :])
        self.say(f">>> largest gap between consecutive slots around the hand-over: {gap:.2f} s")
        return gap

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.store.close()


def _due(slot: str) -> float:
    return datetime.fromisoformat(slot.partition("@")[2]).timestamp()


def _largest_gap(runs: list[dict[str, object]]) -> float:
    dues = sorted(_due(str(r["slot"])) for r in runs if r.get("slot"))
    return max((b - a for a, b in itertools.pairwise(dues)), default=0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="a quicker run (CI)")
    parser.add_argument("--leader-url", help="lease store (default: file:// in a temp dir)")
    parser.add_argument("--broker-url", help="broker (default: filesystem transport)")
    parser.add_argument("--ttl", type=float, default=3.0, help="lease ttl in seconds")
    parser.add_argument("--every", type=float, default=0.5, help="schedule period in seconds")
    args = parser.parse_args()
    phase = 4.0 if args.short else 10.0

    demo = Demo(args)
    try:
        demo.start()
        demo.wait_for_leader(30)
        demo.run_until(time.monotonic() - demo.t0 + phase)
        crash_gap = demo.fail_over(signal.SIGKILL, phase)
        graceful_gap = demo.fail_over(signal.SIGTERM, phase)
    finally:
        demo.stop()
    time.sleep(0.2)
    demo.poll()  # runs the worker finished while stopping

    counts = Counter(str(r["slot"]) for r in demo.runs if r.get("slot"))
    twice = sum(1 for c in counts.values() if c > 1)
    epochs = sorted({int(str(r["epoch"])) for r in demo.runs if r.get("epoch") is not None})
    print()
    print(f"hand-over after SIGKILL: largest gap {crash_gap:.2f} s between slots")
    print(f"hand-over after SIGTERM: largest gap {graceful_gap:.2f} s between slots")
    print(f"epochs seen: {epochs}")
    print(f"{len(counts)} slots, {twice} sent twice")
    return 0 if twice == 0 and len(epochs) >= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
