"""Start-up with a large schedule: replicas of `celery beat` started at once, N code entries.

    .venv/bin/python -m benchmarks.start [--n 300000] [--replicas 1,3] [--cap 300]

The app is ``benchmarks/apps/scale_app.py`` (N hourly crontab entries that do not
fall due during the run, plus ``tick`` every second), on loopback Redis servers
(broker, and the lease store), ttl 5 s. For each replica count, that many
``LeaderScheduler`` replicas start at the same moment; then plain ``celery beat``
(Celery's ``PersistentScheduler``, one process: it has no lock) on the same app.
Columns:

* **app module**: seconds to import the app module, mostly building its
  ``beat_schedule`` dict: the app's own cost, paid by any scheduler;
* **up**: from the start to ``beat: Starting...`` in the first publisher's log
  (Python, Celery and the app imported, beat's banner printed);
* **start**: from the start to the first ``tick`` at the broker; the slot is
  due on a whole second, so up to 1 s of it is the schedule;
* **SIGKILL**: once every standby has started up, from a SIGKILL of the
  publisher to a standby's first ``tick`` (``—`` for plain beat).
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from benchmarks.scale import ROOT, OverCap, Run, _numbers, cell
from harness.groups import VENV_BIN, kill_all
from harness.procs import Proc

STARTING = "beat: Starting..."


@dataclass
class Row:
    scheduler: str
    replicas: int
    up: float | None = None
    start: float | None = None
    sigkill: float | None = None
    note: str = ""


def app_module_seconds(n: int) -> float:
    """Seconds to import the scale app with ``n`` entries (Celery imported before)."""
    code = (
        "import time, celery.schedules; t = time.perf_counter(); "
        "import benchmarks.apps.scale_app; print(time.perf_counter() - t)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BROKER_URL": "memory://"}
    env["SCALE_CODE_N"] = str(n)
    out = subprocess.run(
        [str(VENV_BIN / "python"), "-c", code], env=env, cwd=ROOT, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return float(out.stdout.strip())


def _up(proc: Proc, since_wall: float) -> float | None:
    """Seconds from ``since_wall`` to ``beat: Starting...`` in ``proc``'s log (local time)."""
    for line in proc.lines():
        if STARTING in line and line.startswith("["):
            stamp = line[1:24]  # [2026-12-04 10:37:01,123: INFO/MainProcess] ...
            moment = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
            return moment.timestamp() - since_wall
    return None


def measure(system: str, n: int, replicas: int, cap: float) -> Row:
    """One row: ``replicas`` processes of ``system`` started at once."""
    row = Row("LeaderScheduler" if system == "leader" else "PersistentScheduler", replicas)
    run = Run(system, n, cap, None)
    try:
        t, wall = time.monotonic(), time.time()
        procs = [run.spawn() for _ in range(replicas)]
        first = run.wait(lambda: next(iter(run.recorder.between(t)), None))
        row.start = first.t - t
        leader = next(p for p in procs if p.pid == first.pid)
        row.up = _up(leader, wall)
        standbys = [p for p in procs if p is not leader]
        if standbys:
            for proc in standbys:
                run.settle(proc)
            t = time.monotonic()
            leader.kill_group()
            handed = run.wait(
                lambda: next((m for m in run.recorder.between(t) if m.pid != leader.pid), None)
            )
            row.sigkill = handed.t - t
    except OverCap:
        row.note = f"stopped at the {cap:g} s cap; logs in {run.home}"
    finally:
        run.close()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=300_000, help="hourly code entries")
    parser.add_argument("--replicas", type=_numbers, default=[1, 3], help="LeaderScheduler runs")
    parser.add_argument("--cap", type=float, default=300.0, help="seconds one run may take")
    parser.add_argument("--no-celery", action="store_true", help="skip plain celery beat")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    module = app_module_seconds(args.n)
    plan = [("leader", r) for r in args.replicas] + ([] if args.no_celery else [("celery", 1)])
    rows = []
    try:
        for system, replicas in plan:
            row = measure(system, args.n, replicas, args.cap)
            print(f"  {row}", file=sys.stderr, flush=True)
            rows.append(row)
    finally:
        kill_all()
    print(
        f"_N = {args.n:,} code entries, {os.cpu_count()} CPUs, load average {load[0]:.2f} at "
        f"start and {os.getloadavg()[0]:.2f} at the end; the app module takes {module:.2f} s._\n"
    )
    print("| scheduler | replicas | up s | start s | SIGKILL s | |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        cells = " | ".join(cell(v, ".2f") for v in (r.up, r.start, r.sigkill))
        print(f"| {r.scheduler} | {r.replicas} | {cells} | {r.note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
