"""Beat's load on the lease store over time: 3 beat replicas, 200 entries every 1 s.

Issue 14 measured Redis commands per second creeping up under this constant load
(531 -> 881 in 300 s; about 84 claim scripts a second where one is expected):
the interval entries drifted apart and the one-round-trip batch fell apart.
This benchmark runs the same load for ``--minutes`` (default 10) and prints, per
minute, what the lease store's Redis did (``INFO commandstats``): commands per
second, claim scripts per second (the claim script is the backend's only caller
of ``TYPE``), and the messages that reached the broker. Flat means the last
minute is within 10 % of the first.

    .venv/bin/python -m benchmarks.beat_load [--minutes 10] [--entries 200] [--beats 3]

The broker is a redis-server of its own, emptied every second (nobody consumes).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.groups import VENV_BIN, kill_all, start_child
from harness.servers import RedisServer

TTL = 3.0
EVERY = 1.0
WARM_UP = 15.0
WINDOW = 60.0


@dataclass
class Minute:
    commands: float  # per second
    claims: float  # per second
    messages: float  # per second
    broker_clients: int


def _store_counts(store: RedisServer) -> tuple[int, int]:
    stats = store.commandstats()
    # Leave out this probe's own INFO calls.
    commands = sum(n for name, n in stats.items() if name != "info")
    return commands, stats.get("type", 0)


class Drain:
    """Empties the broker's ``celery`` list every second, counting what it removed."""

    def __init__(self, broker: RedisServer) -> None:
        self._client = broker.client()
        self.removed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            pipe = self._client.pipeline()
            pipe.llen("celery")
            pipe.delete("celery")
            length, _ = pipe.execute()
            self.removed += int(length)

    def clients(self) -> int:
        return int(self._client.info("clients")["connected_clients"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._client.close()


def run(minutes: int, entries: int, beats: int, log: Callable[[str], None]) -> list[Minute]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-beat-load-"))
    with RedisServer() as store, RedisServer() as broker:
        drain = Drain(broker)
        env = {
            "BROKER_URL": broker.url,
            "LEADER_URL": store.url,
            "LEADER_TTL": str(TTL),
            "BEAT_EVERY": str(EVERY),
            "BEAT_ENTRIES": str(entries),
        }
        argv = [str(VENV_BIN / "celery"), "-A", "tests.apps.beat_app", "beat", "-S", "leader"]
        try:
            for i in range(beats):
                start_child(
                    [*argv, "-l", "warning"],
                    {**env, "INSTANCE_ID": f"beat{i}"},
                    Path(__file__).resolve().parent.parent,
                    workdir / f"beat{i}.log",
                )
            time.sleep(WARM_UP)
            rows = []
            before, sent = _store_counts(store), drain.removed
            for minute in range(minutes):
                started = time.monotonic()
                time.sleep(WINDOW)
                after, now_sent = _store_counts(store), drain.removed
                took = time.monotonic() - started
                row = Minute(
                    (after[0] - before[0]) / took,
                    (after[1] - before[1]) / took,
                    (now_sent - sent) / took,
                    drain.clients(),
                )
                rows.append(row)
                log(
                    f"  minute {minute + 1}: {row.commands:.1f} commands/s, "
                    f"{row.claims:.2f} claim scripts/s, {row.messages:.0f} messages/s"
                )
                before, sent = after, now_sent
            return rows
        finally:
            kill_all()
            drain.close()


def table(rows: list[Minute], entries: int, beats: int) -> str:
    lines = [
        "| minute | store commands/s | claim scripts/s | messages/s | broker clients |",
        "|---:|---:|---:|---:|---:|",
    ]
    for i, row in enumerate(rows, start=1):
        lines.append(
            f"| {i} | {row.commands:.1f} | {row.claims:.2f} | {row.messages:.0f} | "
            f"{row.broker_clients} |"
        )
    first, last = rows[0].commands, rows[-1].commands
    change = (last - first) / first if first else 0.0
    verdict = "flat" if abs(change) <= 0.10 else "NOT flat"
    lines.append(
        f"\n{beats} beats, {entries} entries every {EVERY:g} s, ttl {TTL:g} s: store commands "
        f"per second in the last minute {change:+.1%} against the first ({verdict}: goal "
        f"within 10 %); {sum(r.claims for r in rows) / len(rows):.2f} claim scripts per "
        f"second on average, for {1 / EVERY:g} due batch per second."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--entries", type=int, default=200)
    parser.add_argument("--beats", type=int, default=3)
    args = parser.parse_args()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rows = run(args.minutes, args.entries, args.beats, log)
    print(table(rows, args.entries, args.beats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
