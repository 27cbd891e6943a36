"""Burst throughput: N hourly entries fall due in the same second; the leader vs a send_task loop.

An idle leader holds the beat election with N interval entries of one hour,
which the epoch-aligned grid makes due at the same instant, the top of the
hour. Its clock is moved to just past that instant and the time until it has
published every slot is measured: claims (one fenced round trip per batch),
the lease checked between batches, every publish with its ``leader_epoch`` and
``leader_slot`` headers. The state load of its term happened before, as it
does for a leader that was already leading when the hour struck: the store
holds what a previous leader left (every entry ran at the hour before), and
the leader adopts it in a tick before the hour. Settings are the defaults.

In the same run, a bare ``app.send_task`` loop publishes N messages of the same
shape (same task, same two headers) to the same broker through one producer
held for the whole loop, as a fair user loop would. Runs alternate between the
two so that drift in the machine's speed hits both alike; the ratio is the
median of each leader run against the loop runs next to it. The CPU time of
this process per message is shown too: on a shared machine it moves far less
than the rates do. Messages are counted in the broker after each run.

The broker is a redis-server started here; the lease store is another database
of it, or (``--stores redis,postgres``) a PostgreSQL server started here too.

    .venv/bin/python -m benchmarks.burst [--n 100000] [--rounds 3] [--stores redis,postgres]

``run(n, stores=..., rounds=...)`` returns the numbers as a dict, for
``benchmarks/scale.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from celery import Celery

from celery_leader import LeaderScheduler
from celery_leader.backends import Fence, Write, open_store
from celery_leader.schedule.state import dump_state
from celery_leader.settings.config import LeaderConfig
from harness.servers import PostgresServer, RedisServer
from harness.waiting import wait_for

QUEUE = "celery"
TASK = "bench.burst"
#: The entries' period: the hourly grid that puts them all in one second.
PERIOD = timedelta(hours=1)
#: Where the leader's clock stands for its first (loading) tick: before the hour.
BEFORE = timedelta(seconds=5)
#: Where it stands for the burst: just past the hour.
PAST = timedelta(milliseconds=100)
GOAL = 0.9
#: Entries whose state one seeding claim writes.
SEED_CHUNK = 1000
STORES = ("redis", "postgres")


def top_of_hour() -> datetime:
    """The next top of the hour (UTC): the instant every entry of the burst is due."""
    now = datetime.now(timezone.utc)
    return now.replace(minute=0, second=0, microsecond=0) + PERIOD


def make_app(broker_url: str, store_url: str, n: int) -> Celery:
    app = Celery("bench_burst", broker=broker_url, set_as_current=False)
    app.conf.leader_url = store_url
    app.conf.beat_schedule = {
        f"e{i}": {"task": TASK, "schedule": PERIOD.total_seconds()} for i in range(n)
    }
    return app


def seed(app: Celery, hour: datetime) -> None:
    """Store what a previous leader would leave: every entry ran at the hour before."""
    config = LeaderConfig.from_app(app)
    backend = open_store(config)
    try:
        term = backend.lock.acquire(config.beat_election, "previous-leader", config.ttl, 0).term
        assert term is not None, "someone holds the beat election"
        state = dump_state(hour - PERIOD, 1, term.epoch, "previous-leader")
        names = list(app.conf.beat_schedule)
        for start in range(0, len(names), SEED_CHUNK):
            claims = [Write(name, None, state) for name in names[start : start + SEED_CHUNK]]
            assert all(backend.records.claim(Fence(config.beat_election, term), claims)), (
                "state not seeded"
            )
        backend.lock.release(config.beat_election, term)
    finally:
        backend.close()


class Timed:
    """Wall and CPU seconds of this process over a ``with`` block."""

    wall = cpu = 0.0

    def __enter__(self) -> Timed:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu


def leader_burst(app: Celery) -> Timed:
    """How long the leader takes to publish every slot of the burst."""
    hour = top_of_hour()
    seed(app, hour)
    scheduler = LeaderScheduler(app=app)
    try:
        wait_for(scheduler.lease.is_leader, 30, message="the scheduler never won the election")
        # The protocol's clock is the only thing moved: the lease runs on the
        # monotonic clock and is untouched.
        protocol = scheduler._protocol
        protocol.clock = lambda: hour - BEFORE
        # Adopts every entry's state, a chunk per tick; nothing is due yet.
        while (first := scheduler.tick()) == 0 and not protocol.loaded():
            pass
        assert first > 0, "something was due before the hour"
        protocol.clock = lambda: hour + PAST
        with Timed() as timed:
            while scheduler.tick() == 0:
                pass
        return timed
    finally:
        scheduler.close()


def send_task_loop(app: Celery) -> Timed:
    """How long a bare loop takes to send the same messages through one held producer."""
    slot_time = top_of_hour().isoformat(timespec="milliseconds")
    with app.connection_for_write() as connection:
        producer = app.amqp.Producer(connection, auto_declare=False)
        with Timed() as timed:
            for name in app.conf.beat_schedule:
                headers = {"leader_epoch": 1, "leader_slot": f"{name}@{slot_time}"}
                app.send_task(TASK, producer=producer, headers=headers)
        return timed


@contextmanager
def servers(stores: tuple[str, ...]) -> Iterator[tuple[RedisServer, dict[str, Callable[[], str]]]]:
    """The broker, and for each store a function that empties it and returns its URL."""
    with ExitStack() as stack:
        broker = stack.enter_context(RedisServer())
        urls: dict[str, Callable[[], str]] = {}
        if "redis" in stores:
            urls["redis"] = lambda: broker.url.rsplit("/", 1)[0] + "/1"
        if "postgres" in stores:
            pg = stack.enter_context(PostgresServer())

            def pg_url() -> str:
                pg.reset()
                return pg.url

            urls["postgres"] = pg_url
        yield broker, urls


def one_run(
    broker: RedisServer, store_url: str, n: int, contender: Callable[[Celery], Timed]
) -> tuple[float, float]:
    """Run ``contender`` on an empty broker and store: messages per second, and
    this process's CPU microseconds per message."""
    with broker.client() as client:
        client.flushall()
    app = make_app(broker.url, store_url, n)
    timed = contender(app)
    with broker.client() as client:
        sent = int(client.llen(QUEUE))
    if sent != n:
        raise SystemExit(f"the broker holds {sent:,} messages after a run, not {n:,}")
    return n / timed.wall, timed.cpu / n * 1e6


def run(n: int = 100_000, stores: tuple[str, ...] = ("redis",), rounds: int = 3) -> dict[str, Any]:
    """Measure; returns ``{"n", "loop": {"rates", "cpu"}, "<store>": {"rates", "cpu",
    "ratio"}}``.

    Rates are messages per second, ``cpu`` this process's CPU microseconds per
    message (the machine's other load does not move it much); ``ratio`` is the
    median of each leader run's rate over the mean of the loop runs just before
    and after it.
    """
    loop: dict[str, list[float]] = {"rates": [], "cpu": []}
    result: dict[str, Any] = {"n": n, "loop": loop}

    def measure(into: dict[str, Any], url: str, contender: Callable[[Celery], Timed]) -> None:
        rate, cpu = one_run(broker, url, n, contender)
        into["rates"].append(rate)
        into["cpu"].append(cpu)

    with servers(stores) as (broker, urls):
        redis_store = broker.url.rsplit("/", 1)[0] + "/1"
        measure(loop, redis_store, send_task_loop)
        for store, url in urls.items():
            ours: dict[str, Any] = {"rates": [], "cpu": []}
            ratios = []
            for _ in range(rounds):
                measure(ours, url(), leader_burst)
                measure(loop, redis_store, send_task_loop)
                ratios.append(ours["rates"][-1] / statistics.mean(loop["rates"][-2:]))
                print(
                    f"  {store}: leader {ours['rates'][-1]:,.0f}/s, "
                    f"loop {loop['rates'][-1]:,.0f}/s",
                    file=sys.stderr,
                )
            result[store] = {**ours, "ratio": statistics.median(ratios)}
    return result


def table(result: dict[str, Any]) -> str:
    """The results as a Markdown table with a closing line per store."""
    n = result["n"]
    loop = result["loop"]
    lines = [
        f"{n:,} hourly entries due in the same second, Redis broker on loopback, medians",
        "",
        "| publisher | slots/s | per run | vs send_task loop | CPU µs per slot |",
        "|---|---:|---|---:|---:|",
        f"| bare `send_task` loop, one producer | {statistics.median(loop['rates']):,.0f} | "
        f"{', '.join(f'{r:,.0f}' for r in loop['rates'])} | 1.00 | "
        f"{statistics.median(loop['cpu']):,.0f} |",
    ]
    for store in STORES:
        if store not in result:
            continue
        rates = result[store]["rates"]
        lines.append(
            f"| LeaderScheduler, {store} store | {statistics.median(rates):,.0f} | "
            f"{', '.join(f'{r:,.0f}' for r in rates)} | {result[store]['ratio']:.2f} | "
            f"{statistics.median(result[store]['cpu']):,.0f} |"
        )
    lines.append("")
    for store in STORES:
        if store in result:
            ratio = result[store]["ratio"]
            met = "met" if ratio >= GOAL else "NOT met"
            lines.append(
                f"{store} store: leader / send_task loop = {ratio:.2f} (goal >= {GOAL}: {met})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="entries in the burst")
    parser.add_argument("--rounds", type=int, default=3, help="leader runs per store")
    parser.add_argument(
        "--stores", default="redis", help=f"comma-separated lease stores: {', '.join(STORES)}"
    )
    args = parser.parse_args(argv)
    stores = tuple(s for s in args.stores.split(",") if s)
    unknown = sorted(set(stores) - set(STORES))
    if unknown or not stores or args.n < 1 or args.rounds < 1:
        parser.error(f"--stores takes {', '.join(STORES)}; --n and --rounds at least 1")
    print(table(run(args.n, stores, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
