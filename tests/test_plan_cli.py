"""``celery -A proj leader plan`` and ``python -m celery_leader plan MODULE``, as users run them.

The slot arithmetic is tested in tests/test_clock_unit.py and against real replicas in
tests/test_fake_clock.py; here: the two command lines, their input errors and ``--stored``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from celery_leader.backends import Fence, Write, open_store
from celery_leader.schedule.series import utc
from celery_leader.schedule.state import dump_state
from celery_leader.settings.config import LeaderConfig

ROOT = Path(__file__).resolve().parent.parent
CELERY = Path(sys.executable).with_name("celery")
#: Nothing listens here: a plan without --stored reaches neither broker nor store.
NOWHERE = "redis://127.0.0.1:1/0"


def run(argv: list[str], leader_url: str = NOWHERE) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BROKER_URL": NOWHERE,
        "LEADER_URL": leader_url,
        "CLOCK_POLICIES": "once,all",
    }
    return subprocess.run(
        argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def celery_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return run([str(CELERY), "-A", "tests.apps.clock_app", "leader", "plan", *args])


def dramatiq_plan(*args: str, leader_url: str = NOWHERE) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "celery_leader", "plan", "tests.apps.clock_dramatiq", *args]
    return run(argv, leader_url)


def test_celery_plan_prints_the_slots_in_the_apps_zone() -> None:
    done = celery_plan("--from", "2026-03-29T01:50", "--to", "2026-03-29T03:00")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "-once" in line and "min-" not in line]
    assert [row.split()[-1] for row in rows] == [
        "fixed230-once@2026-03-29T03:00:00.000+02:00",
        "q15-once@2026-03-29T03:00:00.000+02:00",
    ]
    assert "CEST" in rows[0] and "local time in Europe/Berlin" in done.stdout


def test_dramatiq_plan_prints_json_with_utc_slot_names() -> None:
    done = dramatiq_plan("--from", "2026-10-25T00:20Z", "--to", "2026-10-25T01:40Z", "--json")
    assert done.returncode == 0, done.stderr
    slots = [s for s in json.loads(done.stdout)["slots"] if s["entry"] == "q15-all"]
    assert [s["slot"] for s in slots][:3] == [
        "q15-all@2026-10-25T00:30:00.000+00:00",
        "q15-all@2026-10-25T00:45:00.000+00:00",
        "q15-all@2026-10-25T01:00:00.000+00:00",
    ]
    assert slots[0]["local"] == "2026-10-25T00:30:00.000+00:00" and not slots[0]["late"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--from", "2026-10-25T02:00Z", "--to", "2026-10-25T01:00Z"], "is before --from"),
        (["--from", "soon", "--to", "2026-10-25T01:00Z"], "cannot read time 'soon'"),
        (["--from", "2026-10-25T02:30", "--to", "now"], "happens twice in Europe/Berlin"),
        (["--from", "now", "--to", "now", "--tz", "Mars/Base"], "unknown time zone 'Mars/Base'"),
        (["--from", "2026-01-01T00:00Z", "--to", "2027-06-01T00:00Z"], "longer than 366 days"),
    ],
)
def test_bad_input_fails_in_one_line_with_exit_code_2(args: list[str], error: str) -> None:
    # Dramatiq's default zone is UTC: give it Berlin (a later --tz of the case wins).
    for done in (celery_plan(*args), dramatiq_plan("--tz", "Europe/Berlin", *args)):
        assert done.returncode == 2, (done.args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and error in done.stderr, done.stderr


def test_stored_state_makes_the_policy_send_missed_slots_late(redis_url: str) -> None:
    url = redis_url.rpartition("/")[0] + "/5"
    backend = open_store(LeaderConfig.from_env({}, leader_url=url))
    term = backend.lock.acquire("beat", "previous", 3.0, 0).term
    assert term is not None
    last = dump_state(utc(datetime(2026, 3, 29, 0, 0)), 3, term.epoch, "previous")  # 01:00 CET
    assert all(backend.records.claim(Fence("beat", term), [Write("q15-all", None, last)]))
    backend.lock.release("beat", term)
    backend.close()
    window = ["--from", "2026-03-29T01:10Z", "--to", "2026-03-29T01:20Z", "--json"]
    done = dramatiq_plan(*window, "--stored", leader_url=url)
    assert done.returncode == 0, done.stderr
    slots = [(s["slot"], s["late"]) for s in json.loads(done.stdout)["slots"]]
    q15 = [(slot.partition("T")[2][:5], late) for slot, late in slots if "q15-all" in slot]
    # 00:15 to 01:00 UTC were missed ("all" sends them late); 01:15 is on time.
    assert q15 == [("00:15", True), ("00:30", True), ("00:45", True), ("01:00", True),
                   ("01:15", False)]  # fmt: skip
    # Entries the store does not know start at --from, as without --stored.
    assert [slot for slot, _ in slots if "q15-once" in slot] == [
        "q15-once@2026-03-29T01:15:00.000+00:00"
    ]


def test_dramatiq_plan_of_a_module_that_does_not_exist_fails_in_one_line() -> None:
    argv = [sys.executable, "-m", "celery_leader", "plan", "no_such_app", "--from", "now"]
    done = run([*argv, "--to", "now"])
    assert done.returncode == 2
    assert done.stderr == "Error: cannot import 'no_such_app': no such module (see --path)\n"
