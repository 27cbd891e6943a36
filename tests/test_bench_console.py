"""The console benchmark at a small size, as a smoke run uses it: every view and its
JSON twin get a row with their round trips, the targeted rows say whether they
meet 300 ms, and the console process's RSS is reported."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from benchmarks.console import with_runs

ROOT = Path(__file__).resolve().parent.parent
VIEWS = ["cluster", "entries, page 1", "entries, a later page", "entries, search",
         "entries, paused", "entry with history", "timeline", "problems", "plan"]  # fmt: skip


def test_run_records_fill_as_few_entries_as_hold_them_at_the_cap() -> None:
    held = with_runs(100_000, 1_000_000, 10_000)
    assert len(held) == 100 and {n for _, n in held} == {10_000}
    assert held[1][0] == "report-001000"  # spread over the list
    assert sum(n for _, n in with_runs(50, 25_001, 10_000)) == 25_001
    assert with_runs(2, 5, 10_000) == [("report-000000", 5)]


def test_small_run_prints_every_view_with_its_round_trips_and_the_rss() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "benchmarks.console", "--entries", "300",
         "--runs", "3000", "--requests", "3", "--http", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {cells[0]: cells for line in done.stdout.splitlines()
            if len(cells := [c.strip() for c in line.strip("|").split("|")]) == 8}  # fmt: skip
    for view in VIEWS:
        for label in (view, f"{view} (JSON)"):
            assert label in rows, done.stdout
            assert int(rows[label][6]) >= 1  # every view reads the store
            assert rows[label][5] != "—"  # and was asked over HTTP
    assert rows["entries, page 1"][7] in ("yes", "**no**")
    assert rows["entry with history (JSON)"][7] in ("yes", "**no**")
    assert rows["plan"][7] == ""
    assert re.search(r"console process RSS after every view: \d+ MB", done.stdout)
