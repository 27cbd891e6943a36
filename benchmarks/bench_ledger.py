"""What the run ledger costs a worker per beat-sent message, beside a bare task's round trip.

Run:  python benchmarks/bench_ledger.py [--messages 2000]

Starts its own redis-server and PostgreSQL on loopback. Per message it times,
in one process, what a worker adds with ``leader_ledger`` on: recording the
slot started before the body (one round trip) and finished after it (one
more), through :class:`~celery_leader.ledger.RunGuard` exactly as the Celery
and Dramatiq hooks call it; and, for scale, the broker round trip every task
pays anyway: one Celery-sized message published to and fetched from a Redis
queue with kombu. Prints median and p99 per message, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kombu import Connection

from celery_leader.backends import open_store
from celery_leader.ledger import LedgerTarget, RunGuard
from celery_leader.settings.config import LeaderConfig
from harness.servers import PostgresServer, RedisServer

BODY = {"task": "proj.tasks.report", "args": [], "kwargs": {}, "id": str(uuid.uuid4())}


def timed(fn: Callable[[int], object], n: int) -> list[float]:
    """Seconds per call of ``fn(i)``, after a warm-up of 50 calls."""
    for i in range(50):
        fn(-1 - i)
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def ledger_cost(url: str, n: int) -> list[float]:
    config = LeaderConfig.from_mapping({"leader_url": url, "leader_key_prefix": "bench"})
    target = LedgerTarget(
        open_store(config).runs,
        "beat",
        "bench",
        15.0,
        5.0,
        config.ledger_retention,
        config.ledger_keep,
    )
    guard = RunGuard(target, "rerun")
    run = uuid.uuid4().hex[:6]

    def one(i: int) -> None:
        slot = f"report-{run}@{i}"
        assert guard.begin(slot).run
        guard.finish(slot, "success")

    return timed(one, n)


def broker_cost(url: str, n: int) -> list[float]:
    with Connection(url) as conn:
        queue = conn.SimpleQueue(f"bench-{uuid.uuid4().hex[:6]}")

        def one(i: int) -> None:
            queue.put(BODY, headers={"leader_slot": f"report@{i}"})
            queue.get(timeout=5).ack()

        try:
            return timed(one, n)
        finally:
            queue.close()


def row(what: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"| {what} | {statistics.median(ms):.3f} | {p99:.3f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    n = parser.parse_args().messages
    with RedisServer() as redis_server, PostgresServer() as pg:
        rows = [
            row(
                "bare task: publish + fetch one message (Redis broker)",
                broker_cost(redis_server.url, n),
            ),
            row("run ledger: started + finished (Redis store)", ledger_cost(redis_server.url, n)),
            row("run ledger: started + finished (PostgreSQL store)", ledger_cost(pg.url, n)),
        ]
    print(f"Worker-side cost per beat-sent message, {n} messages, loopback (ms):\n")
    print("| per message | median | p99 |")
    print("|---|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
