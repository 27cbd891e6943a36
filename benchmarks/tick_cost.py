"""What one beat tick costs as the schedule grows, in-process, on the memory store.

For N code entries (N - 1 hourly interval entries and one every second) a
``LeaderScheduler`` leads on a ``memory://`` store and publishes to Celery's
in-memory broker. Each N runs in a fresh child process, so that its RSS is its own.
It prints, per N:

* **first dispatch**: from the first leader tick (the promotion) to the 1 s
  entry's first slot, in seconds;
* **longest tick**: the longest single tick while the new term loads its state
  (what the tick watchdog sees);
* **loaded**: from the promotion until every entry's state is loaded;
* **idle tick**: the median tick once loaded, in milliseconds (nothing due but
  the 1 s entry);
* **RSS / entry**: the process's RSS after loading, less before the schedule
  was built, per entry (Celery's own entries included).

    .venv/bin/python -m benchmarks.tick_cost [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

IDLE_TICKS = 30


def _rss() -> int:
    """This process's resident set, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def measure(size: int) -> dict[str, float]:
    """One row of the table, measured in this process."""
    from celery import Celery
    from celery.signals import before_task_publish

    from celery_leader import LeaderScheduler

    sent: list[float] = []

    @before_task_publish.connect(weak=False)
    def _published(headers: dict[str, Any] | None = None, **_: object) -> None:
        if headers and str(headers.get("leader_slot", "")).startswith("every-second@"):
            sent.append(time.perf_counter())

    app = Celery("tick_cost", broker="memory://")
    app.conf.leader_url = f"memory://{uuid.uuid4().hex}"
    app.conf.leader_ttl = 5
    app.conf.beat_schedule = {
        f"hourly-{i}": {"task": "bench.noop", "schedule": 3600.0} for i in range(size - 1)
    }
    app.conf.beat_schedule["every-second"] = {"task": "bench.noop", "schedule": 1.0}
    rss_before = _rss()
    scheduler = LeaderScheduler(app=app)  # not lazy: as `celery beat` builds it
    deadline = time.monotonic() + 10
    while not scheduler.lease.is_leader():
        if time.monotonic() > deadline:
            raise SystemExit("the memory store never elected this scheduler")
        time.sleep(0.01)
    protocol = scheduler._protocol
    promoted = time.perf_counter()
    longest = 0.0
    loaded_at: float | None = None
    while loaded_at is None or not sent:
        started = time.perf_counter()
        sleep = scheduler.tick()
        ended = time.perf_counter()
        longest = max(longest, ended - started)
        if loaded_at is None and protocol.loaded():
            loaded_at = ended
        if ended - promoted > 600:
            raise SystemExit(f"N={size}: nothing sent in 600 s")
        if loaded_at is not None and not sent:
            time.sleep(min(sleep, 0.05))
    first = sent[0] - promoted
    rss = _rss() - rss_before
    idle = []
    for _ in range(IDLE_TICKS):
        started = time.perf_counter()
        scheduler.tick()
        idle.append(time.perf_counter() - started)
        time.sleep(0.005)
    scheduler.close()
    return {
        "first": first,
        "longest": longest,
        "loaded": loaded_at - promoted,
        "idle_ms": statistics.median(idle) * 1000,
        "rss_kb": rss / size / 1024,
    }


def main(argv: list[str] | None = None) -> int:
    """Run every size in a child process and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child's own run
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return 0
    print(
        f"{'N':>8}  {'first dispatch':>14}  {'longest tick':>12}  {'loaded':>8}  "
        f"{'idle tick':>10}  {'RSS / entry':>11}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.tick_cost", "--one", str(size)],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{size:>8}  {row['first']:>12.3f} s  {row['longest']:>10.3f} s  "
            f"{row['loaded']:>6.2f} s  {row['idle_ms']:>7.2f} ms  {row['rss_kb']:>8.2f} KB",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
