"""The README's short tour, run as written against a real Redis.

Its Python blocks become ``proj/celery.py``; each line of its shell block runs as
a command (beat in the background). The only change is the server's address:
the tour's host ``redis:6379`` becomes the test's Redis on 127.0.0.1.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from harness.procs import Procs
from harness.waiting import wait_for
from tests.docs_text import code_blocks

BIN = Path(sys.executable).parent
README = "README.md"
TOUR = "## A short tour"


def tour_blocks() -> tuple[list[str], list[str]]:
    """The tour's Python blocks and its command lines (after the ``pip install``)."""
    text = (Path(__file__).resolve().parent.parent / README).read_text()
    assert TOUR in text
    python = [b for b in code_blocks(README, "python") if "app" in b]
    shell = [b for b in code_blocks(README, "bash") if "celery -A proj" in b]
    assert len(python) == 2 and len(shell) == 1, (python, shell)
    commands = [line for line in shell[0].splitlines() if line and not line.startswith("#")]
    return python, commands


def run(command: str, cwd: Path, redis: str) -> subprocess.CompletedProcess[str]:
    words = shlex.split(command.split("  #")[0].replace("redis://redis:6379", redis))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    env["PYTHONPATH"] = str(cwd)
    while "=" in words[0]:  # VAR=value before the command
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    words[0] = str(BIN / words[0]) if words[0] in ("celery", "python") else words[0]
    return subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_the_readme_tour_runs_as_written(tmp_path: Path, redis_url: str, procs: Procs) -> None:
    redis = redis_url.rsplit("/", 1)[0]  # redis://127.0.0.1:<port>
    python, commands = tour_blocks()
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    source = "\n\n".join(python).replace("redis://redis:6379", redis)
    (tmp_path / "proj" / "celery.py").write_text(source)

    beat, status, resign, check, plain = commands
    assert beat.startswith("celery -A proj beat"), beat
    words = shlex.split(beat.split("  #")[0])
    proc = procs.spawn_python(
        "from celery.__main__ import main; main()",
        *words[1:],
        env={"PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,
    )

    # status exits 0 once beat leads; the one without Celery needs CELERY_LEADER_URL.
    wait_for(
        lambda: run(status, tmp_path, redis).returncode == 0,
        30,
        interval=0.2,
        message=lambda: f"beat never led:\n{proc.output()}",
    )
    assert "beat" in run(status, tmp_path, redis).stdout
    shown = run(plain, tmp_path, redis)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "beat" in shown.stdout
    wait_for(lambda: run(check, tmp_path, redis).returncode == 0, 15, interval=0.2)
    handed = run(resign, tmp_path, redis)
    assert handed.returncode == 0, handed.stdout + handed.stderr
