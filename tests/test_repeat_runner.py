"""scripts/repeat.sh: what it reads out of a run's output, on canned output."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The end of a red `bash .ci/run` as scripts/test.sh writes it: the streams'
#: own lines (with pytest's -ra summary), then the failures of all three repeated.
RED = """\
==> pytest -m timing  |  pytest -m paced  |  scripts/matrix.py, then pytest -n 2
[timing] tests/test_beat_chaos.py ......F.
[rest] | oldest-3.10 | passed | unit ok, contract ok; celery 5.3.0 |
[rest] | newest-3.13 | FAILED | unit ok, contract FAILED; celery 5.5.3 |
[timing] FAILED tests/test_cluster_failover_chaos.py::test_three_beats_through_a_cluster_\
master_failover[cut, acks=0 shows the hazard] - AssertionError: a slot sent twice
[rest] FAILED tests/test_lease_redis.py::test_steady_state_memory_and_commands - \
AssertionError: no growth at steady state
[rest] ERROR tests/test_worker_processes.py::test_reject_backs_off_while_nobody_leads - \
TimeoutError
[paced] ============ 15 passed in 402.12s (0:06:42) ============
==> what failed, in all three streams
[timing] FAILED tests/test_cluster_failover_chaos.py::test_three_beats_through_a_cluster_\
master_failover[cut, acks=0 shows the hazard] - AssertionError: a slot sent twice
[rest] | newest-3.13 | FAILED | unit ok, contract FAILED; celery 5.5.3 |
[rest] FAILED tests/test_lease_redis.py::test_steady_state_memory_and_commands - \
AssertionError: no growth at steady state
[rest] ERROR tests/test_worker_processes.py::test_reject_backs_off_while_nobody_leads - \
TimeoutError
FAILED: pytest -m timing (exit status 1)
"""


def failures(tmp_path: Path, output: str) -> list[str]:
    log = tmp_path / "run-1.log"
    log.write_text(output)
    listed = subprocess.run(
        ["bash", "-c", 'source scripts/repeat.sh && failures "$1"', "failures", str(log)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.splitlines()


def test_each_failed_test_once_with_its_stream(tmp_path: Path) -> None:
    assert failures(tmp_path, RED) == [
        "tests/test_cluster_failover_chaos.py::test_three_beats_through_a_cluster_master_"
        "failover[cut, acks=0 shows the hazard] (timing)",
        "matrix cell newest-3.13 (rest)",
        "tests/test_lease_redis.py::test_steady_state_memory_and_commands (rest)",
        "tests/test_worker_processes.py::test_reject_backs_off_while_nobody_leads (rest, error)",
    ]


def test_a_run_stopped_before_the_tests_names_the_check(tmp_path: Path) -> None:
    output = "==> ruff check celery_leader tests\ntests/x.py:1:1: F401 unused\nFAILED: ruff check\n"
    assert failures(tmp_path, output) == ["ruff check"]


def test_a_green_run_names_nothing(tmp_path: Path) -> None:
    output = "[timing] ==== 108 passed in 700.00s ====\n==> all three streams passed\n"
    assert failures(tmp_path, output) == []
