"""Crash hand-over on Redis at ttl 3 s and at the default 15 s, beside redbeat and dramatiq-crontab.

Run:  python -m benchmarks.crash_gap [--reps N]   (prints Markdown)

Three replicas per system on one Redis lock store; the replica that is sending
is killed (SIGKILL of its process group), ``--reps`` times per system and ttl
(default 10), and a replacement joins as an orchestrator would. The gap is the
longest silence at the broker around the kill. Beat systems use
``benchmarks/failover.py`` (an entry every 0.1 s); the Dramatiq schedulers
use ``benchmarks/bench_dramatiq.py`` (every 0.2 s). Systems that wait out
their lock run ``COMPARE_REPS`` times only: their gap is the lock timeout,
run after run. A gap longer than the benchmark waits (15 s) shows as ``>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import bench_dramatiq, failover
from harness.groups import VENV_BIN
from harness.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
TTLS = (3, 15)
#: Kills per ttl for celery-leader.
REPS = 10
#: Runs of the systems that wait out their lock (redbeat, dramatiq-crontab).
COMPARE_REPS = 3
DRAMATIQ = str(VENV_BIN / "dramatiq")
CRONTAB_SETTINGS = "--settings=benchmarks.apps.crontab_bench.settings"


@dataclass
class Row:
    system: str
    period: float
    #: ttl -> (gaps, one per run, None when nothing came within the benchmark's wait; dups)
    by_ttl: dict[float, tuple[list[float | None], int]] = field(default_factory=dict)


def _beats(ttl: float, reps: int, log: Callable[[str], None]) -> list[Row]:
    systems = (
        failover.System("leader-redis", "celery-leader beat", "leader", "redis", ttl, ("sigkill",)),
        failover.System("redbeat", "celery-redbeat", "redbeat", "redis", ttl, ("sigkill",)),
    )
    rows = []
    for system, runs in zip(systems, (reps, COMPARE_REPS), strict=True):
        [result] = failover.run(runs, False, log, (system,))
        gaps = [None if t.censored else t.gap for t in result.trials]
        row = Row(system.label, failover.PERIOD)
        row.by_ttl[ttl] = (gaps, sum(t.dups for t in result.trials) + result.stray_dups)
        rows.append(row)
    return rows


def _dramatiq(ttl: float, reps: int) -> list[Row]:
    rows = []
    with RedisServer() as broker, RedisServer() as store:
        common = {
            "BROKER_URL": broker.url,
            "PERIOD": str(bench_dramatiq.PERIOD),
            "TTL": str(ttl),
            "PYTHONPATH": str(ROOT),
        }
        leader = bench_dramatiq.run_locked(
            "celery-leader Dramatiq scheduler",
            [DRAMATIQ, "benchmarks.apps.dramatiq_leader", "-p", "1", "-t", "1", "--queues", "none"],
            {**common, "CELERY_LEADER_URL": store.url, "CELERY_LEADER_TTL": str(ttl)},
            reps,
            broker,
            store,
            lambda c: bench_dramatiq.leader_sender(c, store.url),
            ("sigkill",),
        )
        crontab = bench_dramatiq.run_locked(
            "dramatiq-crontab (Redis lock)",
            [sys.executable, "-m", "django", "crontab", "--no-heartbeat", CRONTAB_SETTINGS],
            {**common, "LOCK_URL": store.url},
            COMPARE_REPS,
            broker,
            store,
            bench_dramatiq.crontab_sender,
            ("sigkill",),
        )
    for result in (leader, crontab):
        row = Row(result.system, bench_dramatiq.PERIOD)
        # bench_dramatiq counts pairs less than half a period apart (no slot names there).
        dups = int(result.duplicates.split()[0]) if result.duplicates[:1].isdigit() else -1
        row.by_ttl[ttl] = (result.gaps["sigkill"], dups)
        rows.append(row)
    return rows


def run(reps: int, log: Callable[[str], None]) -> list[Row]:
    """Every system at every ttl in ``TTLS``; one row per system."""
    merged: dict[str, Row] = {}
    for ttl in TTLS:
        log(f"  SIGKILL hand-over at ttl {ttl:g} s")
        for row in _beats(ttl, reps, log) + _dramatiq(ttl, reps):
            merged.setdefault(row.system, Row(row.system, row.period)).by_ttl.update(row.by_ttl)
    return list(merged.values())


def _cell(gaps: list[float | None]) -> str:
    done = [g for g in gaps if g is not None]
    if not done:
        return "none within 15 s" if gaps else "not run"
    text = f"{statistics.median(done):.2f} / {max(done):.2f} s ({len(gaps)} runs)"
    if len(done) < len(gaps):
        text += f", {len(gaps) - len(done)} over 15 s"
    return text


def table(rows: list[Row]) -> str:
    heads = " | ".join(f"SIGKILL gap, ttl {ttl:g} s: median / max" for ttl in TTLS)
    lines = [f"| system | period | {heads} | sent twice |", "|---" * (3 + len(TTLS)) + "|"]
    for row in rows:
        cells = [_cell(row.by_ttl[ttl][0]) if ttl in row.by_ttl else "not run" for ttl in TTLS]
        dups = [row.by_ttl[ttl][1] for ttl in TTLS if ttl in row.by_ttl]
        twice = "?" if -1 in dups else str(sum(dups))
        lines.append(f"| {row.system} | {row.period:g} s | {' | '.join(cells)} | {twice} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reps", type=int, default=REPS, help=f"kills per ttl for celery-leader ({REPS})"
    )
    args = parser.parse_args()
    started = time.monotonic()
    rows = run(args.reps, lambda line: print(line, file=sys.stderr, flush=True))
    print(table(rows))
    print(f"\n_took {(time.monotonic() - started) / 60:.1f} min_")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    sys.exit(main())
