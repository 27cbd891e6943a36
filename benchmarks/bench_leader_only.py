"""What ``@leader_only`` costs per call, next to one Redis GET on loopback.

Run:  python benchmarks/bench_leader_only.py [--calls 200000] [--redis-url redis://...]

Without ``--redis-url`` it starts its own ``redis-server`` on a free loopback
port. The decorated function runs the way a worker runs it: the deadline table
is installed in this process (threads/solo pools run tasks here) and a forked
child reads it too (a prefork pool process). Each figure is the best of five
rounds, per call. The goal: the decorator's overhead (decorated minus
undecorated) stays under 5 % of one Redis GET round trip.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import redis
from celery import Celery

from celery_leader import leader_only
from celery_leader.celery import deadline_table, leadership

ROUNDS = 5
GOAL = 0.05


def per_call(fn: Callable[[int], Any], calls: int) -> float:
    """Best-of-ROUNDS seconds per call of ``fn(i)``."""
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def body(x: int) -> int:
    return x


@leader_only
def gated(x: int) -> int:
    return x


def _in_child(calls: int, conn: Connection) -> None:
    assert gated(1) == 1, "the child does not see the leadership its parent published"
    conn.send(per_call(gated, calls))
    conn.close()


def in_forked_child(calls: int) -> float:
    parent, child = multiprocessing.Pipe()
    proc = multiprocessing.get_context("fork").Process(target=_in_child, args=(calls, child))
    proc.start()
    result = float(parent.recv())
    proc.join()
    return result


def start_redis() -> tuple[subprocess.Popen[bytes], str, str]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    return server, url, workdir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per round")
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    args = parser.parse_args()

    server = workdir = None
    url = args.redis_url
    if url is None:
        server, url, workdir = start_redis()
    try:
        app = Celery("bench", broker=url)
        app.conf.leader_url = url
        app.set_current()
        app.set_default()
        config = leadership.config_of(app)
        # What the worker bootstep does before its pool starts: a table that
        # says this node leads "worker" (for the next hour).
        table = deadline_table.DeadlineTable.create(
            deadline_table.store_id(config.url, config.key_prefix), [config.worker_election]
        )
        table.write(config.worker_election, time.monotonic() + 3600, 1)
        deadline_table.set_process_table(table)
        leadership.forget_views()
        assert gated(1) == 1

        client = redis.Redis.from_url(url)
        client.set("bench:key", "value")

        plain = per_call(body, args.calls)
        local = per_call(gated, args.calls)
        child = in_forked_child(args.calls)
        get = per_call(lambda _i: client.get("bench:key"), max(1000, args.calls // 20))
        table.remove()
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def row(name: str, seconds: float) -> str:
        overhead = seconds - plain
        share = f"{overhead / get:.2%}" if seconds not in (plain, get) else "-"
        return f"| {name} | {seconds * 1e9:,.0f} | {seconds / plain:.1f}x | {share} |"

    print(f"Python {sys.version.split()[0]}, best of {ROUNDS} rounds of {args.calls:,} calls\n")
    print("| call | ns per call | vs undecorated | overhead / Redis GET |")
    print("|---|---:|---:|---:|")
    print(row("undecorated function", plain))
    print(row("@leader_only, in-process (threads/solo pool)", local))
    print(row("@leader_only, forked child (prefork pool)", child))
    print(row("one Redis GET on loopback (redis-py)", get))
    worst = max(local, child) - plain
    verdict = "meets" if worst / get < GOAL else "MISSES"
    print(
        f"\nDecorator overhead: {worst * 1e9:,.0f} ns per call = {worst / get:.2%} of a "
        f"Redis GET round trip ({verdict} the {GOAL:.0%} goal)."
    )


if __name__ == "__main__":
    main()
