"""The Dramatiq quickstart (``bash scripts/quickstart.sh --dramatiq`` without the setup step)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timing]

REPO = Path(__file__).resolve().parents[1]


def test_the_dramatiq_quickstart_hands_over_twice_and_sends_no_slot_twice() -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "example_project" / "dramatiq_quickstart.py"), "--short"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    tally = re.search(r"^(\d+) slots, 0 sent twice$", run.stdout, re.M)
    assert tally is not None and int(tally[1]) >= 10, run.stdout
    assert re.search(r"after SIGKILL: \d+\.\d+ s .* after SIGTERM: 0\.\d+ s", run.stdout), (
        run.stdout
    )
