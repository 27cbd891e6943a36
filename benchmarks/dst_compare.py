"""What fires at Berlin's clock changes: Celery's own PersistentScheduler beside
LeaderScheduler (cron rules, and ``leader_crontab_dst = "celery"``) and the Dramatiq
scheduler, one replica each, on the fake clock of tests/test_fake_clock.py (x60).

    .venv/bin/python -m benchmarks.dst_compare

Prints, per scheduler and clock change, every run of the 02:30 and quarter-hour
crontabs: the fake UTC time it was sent and, for celery-leader, its ``leader_slot``.
Takes about three minutes.
"""

from __future__ import annotations

import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from harness.fakeclock import FakeClock
from harness.fleet import OWN_CLOCK, Fleet
from harness.procs import Procs
from harness.servers import RedisServer

SENDING = re.compile(r"^\[(\S+ \S+),\d+: INFO/MainProcess\] Scheduler: Sending due task (\S+)")
WINDOWS = {
    "fall-back 2026-10-25": (datetime(2026, 10, 24, 23, 50), datetime(2026, 10, 25, 2, 10)),
    "spring-forward 2026-03-29": (datetime(2026, 3, 29, 0, 35), datetime(2026, 3, 29, 1, 25)),
}
KINDS = [
    ("persistent", OWN_CLOCK),
    ("beat", OWN_CLOCK),
    ("beat", {**OWN_CLOCK, "CLOCK_CRONTAB_DST": "celery"}),
    ("dramatiq", OWN_CLOCK),
]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server:
        procs = Procs(Path(tmp))
        try:
            runs = []
            for n, (title, (begin, end)) in enumerate(WINDOWS.items()):
                directory = Path(tmp) / f"clock{n}"
                directory.mkdir()
                clock = FakeClock(directory, begin.replace(tzinfo=timezone.utc), 60)
                fleets = [
                    Fleet(kind, procs, clock, server.url, 2 * (4 * n + i), env)
                    for i, (kind, env) in enumerate(KINDS)
                ]
                instances = [fleet.spawn() for fleet in fleets]
                for fleet, instance in zip(fleets, instances):
                    fleet.ready(instance)
                clock.run()
                runs.append((title, clock, end.replace(tzinfo=timezone.utc), fleets, instances))
            for title, clock, end, fleets, instances in runs:
                clock.wait_until(end, timeout=600)
                print(f"\n== {title}")
                for fleet, instance in zip(fleets, instances):
                    _report(fleet, instance)
                clock.close()
        finally:
            procs.cleanup()


def _report(fleet: Fleet, instance: str) -> None:
    mode = "celery" if fleet.env.get("CLOCK_CRONTAB_DST") else "cron"
    name = {"persistent": "PersistentScheduler", "dramatiq": "Dramatiq scheduler"}.get(
        fleet.kind, f"LeaderScheduler (leader_crontab_dst = {mode!r})"
    )
    print(f"-- {name}")
    if fleet.kind == "dramatiq":
        for sent in fleet.sent():
            if not sent.entry.startswith("min-"):
                print(f"   {sent.slot}")
        return
    slots = iter(s.slot for s in fleet.sent() if not s.entry.startswith("min-"))
    for line in fleet.proc(instance).lines():
        match = SENDING.match(line)
        if match and not match[2].startswith("min-"):
            slot = next(slots, "") if fleet.kind != "persistent" else ""
            print(f"   sent {match[1]} UTC  {match[2]:<14} {slot}")


if __name__ == "__main__":
    main()
