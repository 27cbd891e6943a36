"""Dramatiq schedulers on three replicas: celery-leader, dramatiq-crontab with its lock, periodiq.

Run:  python -m benchmarks.bench_dramatiq [--reps N]   (prints Markdown)

Each system runs three replicas against one Redis broker and, for the two with a
lock, one Redis lock store (ttl / ``LOCK_TIMEOUT`` 3 s): celery-leader as
``dramatiq -p 1`` with the embedded scheduler and ``every(0.2)``;
dramatiq-crontab as ``manage.py crontab`` with ``@interval(seconds=0.2)`` and its
Redis lock (standbys wait for the lock instead of exiting); periodiq as
``periodiq`` with its finest schedule, every minute (it has no lock). A thread
takes every message off the broker as it lands. Faults hit the replica that is
sending: SIGTERM of its process group (``graceful``), SIGKILL of it, and a
restart of the lock store. A gap is the silence between the last message before
the fault and the first after it; a duplicate is a message that lands less than
half a period after the previous one (two schedulers sending the same slot);
celery-leader's messages name their slot, so for it duplicates are counted exactly
(a slot folded after a hand-over may land just before the next one).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from celery_leader.backends import open_store
from celery_leader.settings.config import LeaderConfig
from harness.dramatiq_tap import DramatiqTap
from harness.groups import VENV_BIN, kill_all, pgrp_of, start_child
from harness.procs import Proc
from harness.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
PERIOD = 0.2
TTL = 3
REPLICAS = 3
SETTLE = 1.5
GIVE_UP = 15.0
FAULTS = ("graceful", "sigkill", "store-restart")


@dataclass
class Result:
    system: str
    gaps: dict[str, list[float | None]] = field(default_factory=dict)
    duplicates: str = ""
    survivors: list[int] = field(default_factory=list)  # replicas alive after a store restart


class Cluster:
    """Three replicas of one system; ``sender()`` finds the one that sends."""

    def __init__(self, argv: list[str], env: dict[str, str], workdir: Path) -> None:
        self.argv, self.env, self.workdir = argv, env, workdir
        self.replicas: list[Proc] = []

    def spawn(self) -> Proc:
        log = self.workdir / f"replica{len(self.replicas)}.log"
        child = start_child(self.argv, self.env, ROOT, log)
        self.replicas.append(child)
        return child

    def live(self) -> list[Proc]:
        return [c for c in self.replicas if c.alive]

    def top_up(self) -> None:
        while len(self.live()) < REPLICAS:
            self.spawn()


def wait_steady(tap: DramatiqTap, timeout: float = 60.0) -> bool:
    """Five messages in a row, each within 1.5 periods of the last."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        recent = [a.seen for a in tap.arrivals() if a.seen > time.monotonic() - 1.5]
        if len(recent) >= 5:
            return True
        time.sleep(0.05)
    return False


def close_pairs(seen: list[float]) -> int:
    """Messages that landed less than half a period after the one before."""
    return sum(1 for a, b in pairwise(seen) if b - a < PERIOD / 2)


def trial(
    tap: DramatiqTap,
    cluster: Cluster,
    sender: Callable[[], Proc | None],
    fault: str,
    store: RedisServer,
) -> tuple[float | None, int | None]:
    """One fault; the gap it caused, and how many replicas survived a store restart."""
    if not wait_steady(tap):
        return None, None
    child = sender()
    if child is None:
        return None, None
    before = len(tap.arrivals())
    fault_at = time.monotonic()
    survivors = None
    if fault == "graceful":
        child.signal(signal.SIGTERM)
    elif fault == "sigkill":
        child.kill_group()
    else:
        store.stop()
        store.start()
    end = fault_at + GIVE_UP
    gap = None
    while time.monotonic() < end:
        arrivals = tap.arrivals()
        after = [a.seen for a in arrivals[before:] if a.seen > fault_at + 0.01]
        if after:
            last = max((a.seen for a in arrivals[:before]), default=fault_at)
            gap = after[0] - last
            break
        time.sleep(0.01)
    time.sleep(SETTLE)
    if fault == "store-restart":
        survivors = len(cluster.live())
    if child.alive and fault != "store-restart":
        child.kill_group()
    cluster.top_up()
    return gap, survivors


def leader_sender(cluster: Cluster, store_url: str) -> Callable[[], Proc | None]:
    config = LeaderConfig.from_env({}, leader_url=store_url, leader_ttl=TTL)

    def sender() -> Proc | None:
        backend = open_store(config)
        try:
            holder = backend.lock.holder(config.beat_election)
        finally:
            backend.close()
        if holder is None:
            return None
        group = pgrp_of(int(holder.instance_id.rpartition(":")[2]))
        return next((c for c in cluster.live() if c.pid == group), None)

    return sender


def crontab_sender(cluster: Cluster) -> Callable[[], Proc | None]:
    def sender() -> Proc | None:
        started = [c for c in cluster.live() if "Starting scheduler" in c.output()]
        return started[-1] if len(started) == 1 else None

    return sender


def run_locked(
    name: str,
    argv: list[str],
    env: dict[str, str],
    reps: int,
    broker: RedisServer,
    store: RedisServer,
    sender_of: Callable[[Cluster], Callable[[], Proc | None]],
    faults: tuple[str, ...] = FAULTS,
) -> Result:
    result = Result(name)
    with broker.client() as client:
        client.flushall()
    tap = DramatiqTap(broker.client())
    cluster = Cluster(argv, env, Path(tempfile.mkdtemp(prefix=f"bench-{name}-")))
    try:
        cluster.top_up()
        sender = sender_of(cluster)
        for fault in faults:
            gaps = result.gaps.setdefault(fault, [])
            for _ in range(1 if fault == "store-restart" else reps):
                gap, survivors = trial(tap, cluster, sender, fault, store)
                gaps.append(gap)
                if survivors is not None:
                    result.survivors.append(survivors)
        arrivals = tap.arrivals()
        close = close_pairs([a.seen for a in arrivals])
        slots = [a.options.get("leader_slot") for a in arrivals]
        if all(slots):
            twice = len(slots) - len(set(slots))
            result.duplicates = (
                f"{twice} slots sent twice (by `leader_slot`); {close} pairs < half a period apart"
            )
        else:
            result.duplicates = f"{close} pairs < half a period apart (no slot names)"
    finally:
        tap.close()
        kill_all()
    return result


def run_periodiq(broker: RedisServer) -> Result:
    """periodiq has no lock: count how often each minute slot arrives from three replicas."""
    result = Result("periodiq")
    with broker.client() as client:
        client.flushall()
    tap = DramatiqTap(broker.client())
    env = {"BROKER_URL": broker.url}
    cluster = Cluster(
        [str(VENV_BIN / "periodiq"), "benchmarks.apps.periodiq_bench"],
        env,
        Path(tempfile.mkdtemp(prefix="bench-periodiq-")),
    )
    try:
        cluster.top_up()
        end = time.monotonic() + 75
        while time.monotonic() < end and not tap.arrivals():
            time.sleep(0.1)
        time.sleep(3)  # the other replicas' copies of the same minute
        seen = [a.seen for a in tap.arrivals()]
        result.duplicates = f"each slot sent {len(seen)} times ({REPLICAS} replicas, no lock)"
    finally:
        tap.close()
        kill_all()
    return result


def _gap(values: list[float | None]) -> str:
    if not values:
        return "n/a"
    done = [v for v in values if v is not None]
    if not done:
        return "none"
    text = f"{statistics.median(done):.2f} s"
    if len(done) > 1:
        text += f" (max {max(done):.2f})"
    if len(done) < len(values):
        text += f", {len(values) - len(done)} never"
    return text


def table(results: list[Result]) -> str:
    lines = [
        "| system | graceful gap | SIGKILL gap | store restart: gap, replicas alive | duplicates |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        if r.system == "periodiq":
            restart = "n/a (no lock)"
            graceful = sigkill = "n/a (every replica sends)"
        else:
            graceful, sigkill = _gap(r.gaps["graceful"]), _gap(r.gaps["sigkill"])
            restart = f"{_gap(r.gaps['store-restart'])}, {r.survivors[0] if r.survivors else '?'}/3"
        lines.append(f"| {r.system} | {graceful} | {sigkill} | {restart} | {r.duplicates} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="faults of each kind (3)")
    args = parser.parse_args()
    results = []
    with RedisServer() as broker, RedisServer() as store:
        common = {"BROKER_URL": broker.url, "PERIOD": str(PERIOD), "TTL": str(TTL)}
        leader_url = store.url
        results.append(
            run_locked(
                "celery-leader",
                [
                    str(VENV_BIN / "dramatiq"),
                    "benchmarks.apps.dramatiq_leader",
                    "-p",
                    "1",
                    "-t",
                    "1",
                    "--queues",
                    "none",
                ],
                {**common, "CELERY_LEADER_URL": leader_url, "CELERY_LEADER_TTL": str(TTL)},
                args.reps,
                broker,
                store,
                lambda c: leader_sender(c, leader_url),
            )
        )
        results.append(
            run_locked(
                "dramatiq-crontab (Redis lock)",
                [
                    sys.executable,
                    "-m",
                    "django",
                    "crontab",
                    "--no-heartbeat",
                    "--settings=benchmarks.apps.crontab_bench.settings",
                ],
                {**common, "LOCK_URL": store.url},
                args.reps,
                broker,
                store,
                crontab_sender,
            )
        )
        results.append(run_periodiq(broker))
    print(
        f"Three replicas per system, Redis broker and lock store on loopback, period "
        f"{PERIOD:g} s (periodiq: one minute), ttl {TTL} s, {args.reps} faults of each kind "
        "(one store restart). Gaps: median (max).\n"
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    sys.exit(main())
