"""Dispatch rate: 10,000 entries due at once, LeaderScheduler vs PersistentScheduler.

Everything runs in this process and publishes to the same real Redis broker (a
redis-server started here; the lease store is another database of that server).
Every entry is overdue when a run starts:

* ``PersistentScheduler``: its shelve file says each entry last ran two hours ago.
* ``LeaderScheduler``: the shared schedule state in the lease store says the same,
  as a previous leader would have left it. The scheduler wins the election first;
  its timing starts at its first tick as leader, so it includes what a new leader
  does before dispatching: setting up the schedule and loading 10,000 stored
  states (PersistentScheduler's setup is in its constructor, not timed).
* ``send_task loop``: no scheduler, one ``app.send_task`` per entry with one
  producer: the most the broker connection does, for scale.

A run ends when ``tick()`` says nothing more is due, or after ``--limit`` seconds.
PersistentScheduler needs the limit: its ``tick()`` sends one entry per call and
compares the whole schedule with its previous copy on every call, so each send
costs the same O(entries) and its rate over any window is its rate over the
whole run. The rate is what the broker holds at the end (counted there) over the
time taken. Runs rotate the order of the contenders so that drift in the
machine's speed hits all alike; the table shows medians.

    .venv/bin/python -m benchmarks.bench_dispatch [--entries 10000] [--rounds 3] [--limit 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from celery import Celery
from celery.beat import PersistentScheduler, Scheduler

from celery_leader import LeaderScheduler
from celery_leader.backends import Fence, Write, open_store
from celery_leader.settings.config import LeaderConfig
from harness.servers import RedisServer
from harness.waiting import wait_for

QUEUE = "celery"
TASK = "bench.noop"
#: How overdue every entry is when a run starts.
OVERDUE = timedelta(hours=2)
#: Each entry's period: long, so that no entry comes due twice in a run.
PERIOD = 3600.0
GOAL = 0.8

#: A contender: runs against ``app`` for at most ``limit`` seconds, returns seconds taken.
Run = Callable[[Celery, Path, float], float]


@dataclass
class Result:
    name: str
    runs: list[tuple[int, float]] = field(default_factory=list)  # (messages, seconds)

    @property
    def rates(self) -> list[float]:
        return [sent / seconds for sent, seconds in self.runs]

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


def make_app(broker_url: str, entries: int) -> Celery:
    app = Celery("bench_dispatch", broker=broker_url, set_as_current=False)
    app.conf.leader_url = broker_url.rsplit("/", 1)[0] + "/1"
    app.conf.leader_ttl = 30  # the election is not what is measured: no hand-over mid-run
    app.conf.beat_schedule = {f"e{i}": {"task": TASK, "schedule": PERIOD} for i in range(entries)}
    return app


def run_ticks(scheduler: Scheduler, limit: float) -> float:
    """Beat's loop (without the sleeps) until nothing is due or ``limit`` seconds passed."""
    start = time.perf_counter()
    while True:
        interval = scheduler.tick()
        elapsed = time.perf_counter() - start
        if interval > 0 or elapsed >= limit:
            return elapsed


def persistent(app: Celery, workdir: Path, limit: float) -> float:
    scheduler = PersistentScheduler(app=app, schedule_filename=str(workdir / "beat-schedule"))
    try:
        overdue = datetime.now(timezone.utc) - OVERDUE
        for entry in scheduler.schedule.values():
            entry.last_run_at = overdue
        scheduler.sync()
        return run_ticks(scheduler, limit)
    finally:
        scheduler.close()


def seed_leader_state(app: Celery) -> None:
    """Store the state a previous leader would have left: every entry ran long ago."""
    config = LeaderConfig.from_app(app)
    backend = open_store(config)
    try:
        term = backend.lock.acquire(config.beat_election, "previous-leader", config.ttl, 0).term
        assert term is not None, "someone holds the beat election"
        last_run = (datetime.now(timezone.utc) - OVERDUE).isoformat()
        state = json.dumps({"last_run_at": last_run, "total_run_count": 1})
        claims = [Write(name, None, state) for name in app.conf.beat_schedule]
        assert all(backend.records.claim(Fence(config.beat_election, term), claims)), (
            "state not seeded"
        )
        backend.lock.release(config.beat_election, term)
    finally:
        backend.close()


def leader(app: Celery, workdir: Path, limit: float) -> float:
    seed_leader_state(app)
    scheduler = LeaderScheduler(app=app)
    try:
        wait_for(scheduler.lease.is_leader, 10, message="the scheduler never won the election")
        return run_ticks(scheduler, limit)
    finally:
        scheduler.close()


def send_task_loop(app: Celery, workdir: Path, limit: float) -> float:
    with app.connection_for_write() as connection:
        producer = app.amqp.Producer(connection, auto_declare=False)
        start = time.perf_counter()
        for _ in app.conf.beat_schedule:
            app.send_task(TASK, producer=producer)
            if time.perf_counter() - start >= limit:
                break
        return time.perf_counter() - start


def one_run(server: RedisServer, run: Run, entries: int, limit: float) -> tuple[int, float]:
    with server.client() as client:
        client.flushall()
    app = make_app(server.url, entries)
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as workdir:
        seconds = run(app, Path(workdir), limit)
    with server.client() as client:
        sent = int(client.llen(QUEUE))
    if sent != entries and seconds < limit:
        raise SystemExit(f"a run ended early with {sent} of {entries} messages in the broker")
    return sent, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each contender")
    parser.add_argument("--limit", type=float, default=20.0, help="seconds a run may last")
    args = parser.parse_args(argv)

    contenders: list[tuple[Result, Run]] = [
        (Result("PersistentScheduler"), persistent),
        (Result("LeaderScheduler (Redis lease store)"), leader),
        (Result("send_task loop, no scheduler"), send_task_loop),
    ]
    server = RedisServer()
    server.start()
    try:
        for round_ in range(args.rounds):
            shift = round_ % len(contenders)
            for result, run in contenders[shift:] + contenders[:shift]:
                sent, seconds = one_run(server, run, args.entries, args.limit)
                result.runs.append((sent, seconds))
                print(
                    f"  {result.name}: {sent:,} in {seconds:.2f} s = {sent / seconds:,.0f} msgs/s",
                    file=sys.stderr,
                )
    finally:
        server.close()

    (base, _), (ours, _), (raw, _) = contenders
    print(
        f"\n{args.entries:,} entries due at once, one real Redis broker, "
        f"{args.rounds} runs each (at most {args.limit:g} s per run), medians\n"
    )
    print("| dispatcher | msgs/s | msgs/s per run | sent per run | vs PersistentScheduler |")
    print("|---|---:|---|---|---:|")
    for result in (base, ours, raw):
        print(
            f"| {result.name} | {result.rate:,.0f} | "
            f"{', '.join(f'{r:,.0f}' for r in result.rates)} | "
            f"{', '.join(f'{sent:,}' for sent, _ in result.runs)} | "
            f"{result.rate / base.rate:.2f} |"
        )
    ratio = ours.rate / base.rate
    print(
        f"\nLeaderScheduler / PersistentScheduler = {ratio:.2f} "
        f"(goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'}); "
        f"LeaderScheduler / send_task loop = {ours.rate / raw.rate:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
