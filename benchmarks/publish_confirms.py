"""What publisher confirms cost beat on RabbitMQ: per-publish time with and without.

Beat publishes through :class:`celery_leader.celery.publishing.BeatPublisher`, which
waits for the broker's confirm of every message. This sends ``--count`` messages
through ``app.send_task`` the way beat does (one at a time, to a durable queue),
once with that producer and once with a plain kombu producer (no confirms, what
Celery's beat uses), against a RabbitMQ node started here, and prints the
per-publish median, 99th percentile and rate.

    .venv/bin/python -m benchmarks.publish_confirms [--count 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from celery import Celery

from celery_leader.celery.publishing import BeatPublisher
from harness.servers import RabbitServer


def _timed(send: Callable[[], Any], count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        send()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args()
    with RabbitServer() as rabbit:
        app = Celery("bench", broker=rabbit.url)
        publisher = BeatPublisher(app, confirm_timeout=10.0)
        plain = app.connection_for_write()
        rows = []
        for name, producer in (
            ("plain (no confirms)", lambda: app.amqp.Producer(plain, auto_declare=False)),
            ("BeatPublisher (confirms)", publisher.producer),
        ):
            made = producer()
            times = _timed(lambda p=made: app.send_task("bench.noop", producer=p), 50)  # warm-up
            times = _timed(lambda p=made: app.send_task("bench.noop", producer=p), args.count)
            rows.append((name, times))
        publisher.release()
        plain.release()
    print(f"{args.count} publishes each, RabbitMQ on loopback, durable queue `celery`.\n")
    print("| producer | median ms | p99 ms | per s |")
    print("|---|---:|---:|---:|")
    for name, times in rows:
        ordered = sorted(times)
        p99 = ordered[int(len(ordered) * 0.99) - 1]
        print(
            f"| {name} | {statistics.median(times) * 1000:.3f} | {p99 * 1000:.3f} "
            f"| {len(times) / sum(times):.0f} |"
        )
    plain_ms, confirmed_ms = (statistics.median(times) * 1000 for _, times in rows)
    print(f"\nConfirms add {confirmed_ms - plain_ms:.2f} ms per publish (median).")


if __name__ == "__main__":
    main()
