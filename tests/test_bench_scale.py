"""The scale benchmark's arithmetic: due times read from the slot headers, percentiles,
and the ratio table (``benchmarks/scale.py`` itself runs for an hour)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from benchmarks.scale import Row, _due, loaded, percentile, ratios


def test_due_time_comes_from_leader_slot() -> None:
    headers = {"leader_slot": "tick@2026-12-04T05:50:01.000+00:00"}
    assert _due(headers) == datetime(2026, 12, 4, 5, 50, 1, tzinfo=timezone.utc)


def test_due_time_of_a_bench_slot_is_one_period_after_last_run_naive_means_utc() -> None:
    assert _due({"bench_slot": "tick@2026-12-04T05:50:00.500000"}) == datetime(
        2026, 12, 4, 5, 50, 1, 500000, tzinfo=timezone.utc
    )
    assert _due({"bench_slot": "tick@never"}) is None
    assert _due({}) is None


def test_percentile_is_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0


def test_ratios_pair_each_n_and_leave_unmeasured_cells_empty() -> None:
    ours = Row("leader", 1000, cpu=0.02, sigkill=0.8)
    theirs = Row("redbeat", 1000, cpu=0.01, sigkill=4.0)
    alone = Row("leader", 10000, cpu=0.1)
    lines = ratios([ours, theirs, alone]).splitlines()
    assert len(lines) == 3  # header, rule, one N: 10,000 has no redbeat row
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[0] == "1,000"
    assert cells[2] == "2.00x"  # CPU
    assert cells[-1] == "0.20x"  # SIGKILL
    assert cells[1] == "—"  # start: not measured


def test_a_leader_that_lost_its_term_while_loading_fails_the_run_at_once() -> None:
    """It used to wait for the loaded line until the run's cap (15 minutes)."""
    line = "celery-leader: loaded the state of 1000001 entries in 84.8 s (epoch 1)"
    lost = "celery-leader: vm:1 no longer leads 'beat' (epoch 1): stopping"
    assert loaded("beat: Starting...\n") is None
    found = loaded(f"{line}\n{lost}\n")  # a term ended after its load: measured
    assert found is not None and found.group(1) == "84.8"
    with pytest.raises(RuntimeError, match=r"lost its term while loading: .*no longer leads"):
        loaded(f"{lost}\n{line}\n")
