"""django-celery-beat rows at scale: one ``LeaderDatabaseScheduler`` beat on PostgreSQL.

    .venv/bin/python -m benchmarks.django_rows [--n 100000] [--seconds 30] [--cap 600]

For each N: N hourly crontab rows (due half an hour away, as in
``benchmarks/scale.py``, so none fires) last changed an hour ago, one ``probe``
row every hour, and the example project's 1 s ``heartbeat``. The beat starts
(the lease in Redis), then:

* **start**: seconds from starting the beat to its first heartbeat at the broker;
* **idle CPU**: the beat's CPU seconds per second over ``--seconds``, once it
  has settled, with no edits;
* **edit → slot**: an editor process re-times the probe row from 1 h to 2 s
  (``row.save()``); seconds from the save's commit to the probe's first slot at
  the broker. The slot is due at the next even second after the edit, so up to
  2 s of this is the schedule;
* **late**: that slot's arrival less its due time (its ``leader_slot``): how long
  the leader took to see the edit beyond the schedule;
* **edit CPU**: the beat's CPU seconds from the save to 3 s after the slot, less
  the idle rate over that time: the cost of taking in one edited row.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.scale import PROJECT, Run, cell, django_env, load_django_rows
from harness.groups import VENV_BIN, group_cpu_seconds, kill_all, start_child
from harness.servers import PostgresServer

#: After the rows are made: all of them last changed an hour ago (an edit is
#: told apart by its ``date_changed``), and the probe row.
AGE_AND_PROBE = """
from datetime import timedelta
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask
PeriodicTask.objects.update(date_changed=timezone.now() - timedelta(hours=1))
hourly, _ = IntervalSchedule.objects.get_or_create(every=3600, period="seconds")
PeriodicTask.objects.create(name="probe", task="ticker.tasks.heartbeat", interval=hourly)
"""

#: The edit: the probe re-timed to every 2 s; the time printed once it is committed.
EDIT = """
import time
from django_celery_beat.models import IntervalSchedule, PeriodicTask
two, _ = IntervalSchedule.objects.get_or_create(every=2, period="seconds")
row = PeriodicTask.objects.get(name="probe")
row.interval = two
row.save()
print(f"SAVED {time.time():.3f}", flush=True)
"""


@dataclass
class Row:
    n: int
    start: float | None = None
    idle_cpu: float | None = None
    edit_to_slot: float | None = None
    late: float | None = None
    edit_cpu: float | None = None
    note: str = ""


def _manage(run: Run, code: str) -> str:
    env = {**os.environ, **django_env(run.home, run.pg_url(), run.broker.url)}
    done = subprocess.run(
        [str(VENV_BIN / "python"), str(PROJECT / "manage.py"), "shell", "-c", code],
        env=env, cwd=PROJECT, capture_output=True, text=True,
        timeout=max(1.0, run.deadline - time.monotonic()), check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"manage.py shell failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def measure(run: Run, row: Row, seconds: float, log: Callable[[str], None]) -> None:
    load_django_rows(run)
    _manage(run, AGE_AND_PROBE)
    # The lease in Redis (the broker's server, another database): the file store
    # rewrites every entry's state at each claim, which would be most of what is
    # measured.
    lease = run.broker.url.rsplit("/", 1)[0] + "/2"
    env = {**django_env(run.home, run.pg_url(), run.broker.url), "CELERY_LEADER_URL": lease}
    argv = [str(VENV_BIN / "celery"), "-A", "proj", "beat", "-l", "INFO"]
    argv += ["-s", str(run.home / "schedule")]
    t = time.monotonic()
    beat = start_child(argv, env, PROJECT, run.home / "beat.log")
    row.start = run.first_tick(beat, t)
    log(f"    start -> first heartbeat {row.start:.2f} s")
    run.settle(beat)
    cpu0, t0 = group_cpu_seconds(beat.pid), time.monotonic()
    run.wait(lambda: True if time.monotonic() >= t0 + seconds else None, interval=0.2)
    cpu1, t1 = group_cpu_seconds(beat.pid), time.monotonic()
    row.idle_cpu = (cpu1 - cpu0) / (t1 - t0)
    log(f"    idle CPU {row.idle_cpu:.3f} s/s over {t1 - t0:.0f} s")
    cpu0, t0 = group_cpu_seconds(beat.pid), time.monotonic()
    saved = float(_manage(run, EDIT).split("SAVED ", 1)[1].split()[0])
    probe = run.wait(
        lambda: next(
            (m for m in run.recorder.between(t0) if (m.slot or "").startswith("probe@")), None
        )
    )
    row.edit_to_slot = probe.wall - saved
    row.late = None if probe.due is None else probe.wall - probe.due.timestamp()
    done = probe.t + 3.0
    run.wait(lambda: True if time.monotonic() >= done else None, interval=0.2)
    cpu1, t1 = group_cpu_seconds(beat.pid), time.monotonic()
    # The editor's own start-up (a Django shell) is not the beat's: t0 is before it.
    row.edit_cpu = max(0.0, (cpu1 - cpu0) - row.idle_cpu * (t1 - t0))
    log(
        f"    edit -> first slot {row.edit_to_slot:.2f} s (late {row.late or 0:.2f} s), "
        f"edit CPU {row.edit_cpu:.2f} s"
    )


def run_one(
    n: int, seconds: float, cap: float, pg: PostgresServer, log: Callable[[str], None]
) -> Row:
    log(f"  LeaderDatabaseScheduler, N = {n:,}")
    row = Row(n)
    run = Run("django", n, cap, pg)
    try:
        measure(run, row, seconds, log)
    except Exception as exc:  # OverCap, a failed manage.py: the row says so, logs kept
        row.note = f"stopped: {type(exc).__name__} {str(exc)[:100]}; logs in {run.home}"
        log(f"    {row.note}")
    finally:
        run.close()
    if not row.note:
        shutil.rmtree(run.home, ignore_errors=True)
    return row


def table(rows: list[Row]) -> str:
    lines = [
        "| rows | start s | idle CPU s/s | edit → slot s | late s | edit CPU s | |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        cells = [
            cell(r.start, ".2f"), cell(r.idle_cpu, ".3f"), cell(r.edit_to_slot, ".2f"),
            cell(r.late, ".2f"), cell(r.edit_cpu, ".2f"),
        ]  # fmt: skip
        lines.append(f"| {r.n:,} | " + " | ".join(cells) + f" | {r.note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--n",
        type=lambda text: [int(x.replace("_", "")) for x in text.split(",") if x.strip()],
        default=[100_000],
        help="row counts (default 100000)",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="the idle window")
    parser.add_argument("--cap", type=float, default=600.0, help="seconds one run may take")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load = os.getloadavg()
    pg = PostgresServer()
    pg.start()
    try:
        rows = [run_one(n, args.seconds, args.cap, pg, log) for n in args.n]
    finally:
        kill_all()
        pg.close()
    print(
        f"_{os.cpu_count()} CPUs, load average {load[0]:.2f} at start and "
        f"{os.getloadavg()[0]:.2f} at the end; a {args.seconds:g} s idle window._\n"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
