"""What waiting for the store's replicas (``leader_replica_acks``) adds to one claim batch.

Run:  python -m benchmarks.bench_replica_acks [--batches 300]

Starts its own servers on loopback: a lone redis-server, a Redis master with
one replica, a lone PostgreSQL and a primary with a synchronous (and one with
an asynchronous) standby, replicas linked directly. Each row times
``records.claim()`` of a batch of 1, 10 and 100 entries (every claim wins):
median and 90th percentile, in milliseconds. ``acks 0`` is the claim as it was
before replicas were waited for; on a lone server ``auto`` adds ``ROLE`` to the
claim's round trip (Redis) or a look at ``pg_stat_replication`` to the claim's
statement (PostgreSQL).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from celery_leader.backends import Fence, Write, open_store
from celery_leader.settings.config import LeaderConfig
from harness.pg_standby import PrimaryAndStandby
from harness.servers import PostgresServer, RedisServer
from harness.waiting import wait_for

SIZES = (1, 10, 100)
TTL = 15.0


def time_claims(url: str, acks: str, batches: int) -> list[str]:
    """``median / p90`` ms per claim batch, one cell per size in SIZES."""
    config = LeaderConfig.from_mapping(
        {"leader_url": url, "leader_ttl": TTL, "leader_replica_acks": acks}
    )
    backend = open_store(config)
    cells = []
    try:
        term = backend.lock.acquire("bench", "bench", TTL, 0).term
        assert term is not None
        state = backend.records.load("bench")
        for size in SIZES:
            times = []
            for n in range(batches):
                claims = [Write(f"e{i}", state.get(f"e{i}"), f"{n}") for i in range(size)]
                start = time.perf_counter()
                won = backend.records.claim(Fence("bench", term), claims)
                times.append(time.perf_counter() - start)
                assert all(won), won
                state.update((c.key, c.new) for c in claims)
            p90 = statistics.quantiles(times, n=10)[-1]
            cells.append(f"{statistics.median(times) * 1000:.2f} / {p90 * 1000:.2f}")
        backend.lock.release("bench", term)
    finally:
        backend.close()
    return cells


@contextmanager
def lone_redis() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


@contextmanager
def redis_with_replica() -> Iterator[str]:
    with RedisServer() as master:
        replica = RedisServer(
            "--replicaof", "127.0.0.1", str(master.port), "--repl-diskless-sync-delay", "0"
        )
        with replica:

            def online() -> bool:
                with master.client() as client:
                    return len(client.execute_command("ROLE")[2]) == 1

            wait_for(online, 30, message="replica online")
            yield master.url


@contextmanager
def lone_postgres() -> Iterator[str]:
    with PostgresServer() as server:
        yield server.url


def postgres_with_standby(synchronous: bool) -> Callable[[], AbstractContextManager[str]]:
    @contextmanager
    def run() -> Iterator[str]:
        store = PrimaryAndStandby(synchronous, proxied=False)
        try:
            store.start()
            yield store.primary.url
        finally:
            store.close()

    return run


ROWS: tuple[tuple[str, Callable[[], AbstractContextManager[str]], tuple[str, ...]], ...] = (
    ("Redis, lone server", lone_redis, ("0", "auto")),
    ("Redis, master + 1 replica", redis_with_replica, ("0", "auto")),
    ("PostgreSQL, lone server", lone_postgres, ("0", "auto")),
    ("PostgreSQL, primary + asynchronous standby", postgres_with_standby(False), ("0",)),
    ("PostgreSQL, primary + synchronous standby", postgres_with_standby(True), ("auto",)),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300, help="claim batches per cell")
    args = parser.parse_args()
    print("| store | leader_replica_acks | " + " | ".join(f"batch of {n}" for n in SIZES) + " |")
    print("|---|---|" + "---:|" * len(SIZES))
    for title, servers, settings in ROWS:
        with servers() as url:
            for acks in settings:
                cells = time_claims(url, acks, args.batches)
                print(f"| {title} | {acks} | " + " | ".join(cells) + " |", flush=True)
    print(
        f"\nMilliseconds per `claim()` of one batch, median / 90th percentile of "
        f"{args.batches} batches, loopback."
    )


if __name__ == "__main__":
    main()
