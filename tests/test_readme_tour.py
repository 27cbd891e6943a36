"""The README's short tour, run as written against a real Redis.

The Python blocks of its opening become ``proj/celery.py``; each line of a
section's shell block runs as a command (beat, the worker and ``leader run`` in
the background). The only changes are the server's address (the tour's host
``redis:6379`` becomes the test's Redis on 127.0.0.1) and the console's port.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import requests

from harness.procs import Proc, Procs
from harness.waiting import wait_for
from tests.docs_text import ROOT, fenced

BIN = Path(sys.executable).parent
README = "README.md"
TOUR = "## A short tour"


def tour_section(heading: str = "") -> str:
    """The tour's text under the ``###`` heading starting with ``heading``; ``""``: its opening."""
    text = (ROOT / README).read_text()
    assert TOUR in text
    tour = text.split(TOUR, 1)[1].split("\n## ", 1)[0]
    opening, *rest = re.split(r"^### (.+)\n", tour, flags=re.MULTILINE)
    if not heading:
        return opening
    found = [body for title, body in zip(rest[::2], rest[1::2]) if title.startswith(heading)]
    assert len(found) == 1, (heading, rest[::2])
    return found[0]


def commands(section: str) -> list[str]:
    """The command lines of the section's one shell block that runs ``celery -A proj``."""
    shell = [b for b in fenced(section, "bash") if "celery -A proj" in b]
    assert len(shell) == 1, shell
    return [line for line in shell[0].splitlines() if line and not line.startswith("#")]


def write_project(cwd: Path, redis: str) -> None:
    """``proj/celery.py``: the opening's Python blocks, on the test's Redis."""
    python = [b for b in fenced(tour_section(), "python") if "app" in b]
    assert len(python) == 2, python
    (cwd / "proj").mkdir()
    (cwd / "proj" / "__init__.py").write_text("")
    source = "\n\n".join(python).replace("redis://redis:6379", redis)
    (cwd / "proj" / "celery.py").write_text(source)


def words_of(command: str, redis: str) -> list[str]:
    return shlex.split(command.split("  #")[0].replace("redis://redis:6379", redis))


def run(command: str, cwd: Path, redis: str) -> subprocess.CompletedProcess[str]:
    words = words_of(command, redis)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    env["PYTHONPATH"] = str(cwd)
    while "=" in words[0]:  # VAR=value before the command
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    words[0] = str(BIN / words[0]) if words[0] in ("celery", "python") else words[0]
    return subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def spawn(procs: Procs, command: str, cwd: Path, redis: str) -> Proc:
    """``command`` (a ``celery`` one) in the background, as the reader would start it."""
    words = words_of(command, redis)
    assert words[0] == "celery", command
    return procs.spawn_python(
        "from celery.__main__ import main; main()",
        *words[1:],
        env={"PYTHONPATH": str(cwd)},
        cwd=cwd,
    )


def test_the_readme_tour_runs_as_written(tmp_path: Path, redis_url: str, procs: Procs) -> None:
    redis = redis_url.rsplit("/", 1)[0]  # redis://127.0.0.1:<port>
    write_project(tmp_path, redis)
    beat, status, resign, check, plain = commands(tour_section())
    assert beat.startswith("celery -A proj beat"), beat
    proc = spawn(procs, beat, tmp_path, redis)

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


def test_the_tours_store_entry_is_edited_and_its_slots_run(
    tmp_path: Path, redis_url: str, procs: Procs
) -> None:
    """The sections on schedules as data and on the ledger: the entry the tour adds,
    pauses and resumes at runtime is sent by beat, and its runs are in the ledger."""
    redis = redis_url.rsplit("/", 1)[0]
    write_project(tmp_path, redis)
    beat = commands(tour_section())[0]
    edits = commands(tour_section("Schedules as data"))
    worker, show = commands(tour_section("Every slot runs once"))
    assert worker.startswith("celery -A proj worker"), worker
    beat_proc = spawn(procs, beat, tmp_path, redis)

    for command in edits:
        done = run(command, tmp_path, redis)
        assert done.returncode == 0, command + "\n" + done.stdout + done.stderr
        if " ls" in command:
            assert re.search(r"^prices\s+store\b", done.stdout, re.MULTILINE), done.stdout

    worker_proc = spawn(procs, worker, tmp_path, redis)
    shown: list[str] = []
    # A slot falls due every 10 s; the worker starts and leads its election (the
    # task is @leader_only) in a few seconds: 60 s leaves room for a loaded machine.

    def ran() -> bool:
        done = run(show, tmp_path, redis)
        shown.append(done.stdout + done.stderr)
        return done.returncode == 0 and '"outcome": "success"' in done.stdout

    wait_for(
        ran,
        60,
        interval=1,
        message=lambda: (
            f"no run of prices in the ledger:\n{shown[-1:]}\n--- beat:\n{beat_proc.output()}"
            f"\n--- worker:\n{worker_proc.output()}"
        ),
    )
    assert "recent_runs" in shown[-1] and "prices@" in shown[-1], shown[-1]


def test_the_tours_leader_run_runs_the_command_on_one_host(
    tmp_path: Path, redis_url: str, procs: Procs
) -> None:
    """The ``leader run`` line on two hosts: one runs the command with its epoch, and
    after a SIGTERM to that runner the other runs it under a later epoch."""
    redis = redis_url.rsplit("/", 1)[0]
    write_project(tmp_path, redis)
    runner, status = commands(tour_section("Any command on one host"))
    hosts = [spawn(procs, runner, tmp_path, redis) for _ in range(2)]

    def epochs(proc: Proc) -> list[int]:
        return [int(e) for e in re.findall(r"^sync, epoch (\d+)$", proc.output(), re.MULTILINE)]

    def running() -> list[Proc]:
        return [proc for proc in hosts if epochs(proc)]

    # The lease is free, so one runner wins it as soon as it is up: 30 s is for
    # starting two Celery processes on a loaded machine.
    wait_for(
        running,
        30,
        interval=0.1,
        message=lambda: "\n---\n".join(proc.output() for proc in hosts),
    )
    first = running()
    assert len(first) == 1, [proc.output() for proc in hosts]
    (leader,) = first
    shown = run(status, tmp_path, redis)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f":{leader.pid} " in shown.stdout, shown.stdout

    # The runner stops its command (SIGKILL after the default 5 s grace), releases
    # the lease and exits 0: 15 s is that grace with 10 s to spare.
    leader.signal(signal.SIGTERM, group=False)
    assert leader.wait(15) == 0, leader.output()
    (other,) = [proc for proc in hosts if proc is not leader]
    # The release wakes the other runner at once; had it missed that, it would wait
    # out the default 15 s ttl, then start its command: 20 s.
    wait_for(lambda: epochs(other), 20, interval=0.1, message=other.output)
    assert min(epochs(other)) > max(epochs(leader))


def test_the_tours_console_shows_who_leads(tmp_path: Path, redis_url: str, procs: Procs) -> None:
    """The console section's command, beside the tour's beat: the page it serves
    names the leader. It listens on a free port (``--port 0``) instead of 5555,
    which another program on the machine may hold; nothing else changes."""
    redis = redis_url.rsplit("/", 1)[0]
    write_project(tmp_path, redis)
    beat = spawn(procs, commands(tour_section())[0], tmp_path, redis)
    install, console = commands(tour_section("The console"))
    assert install == "pip install 'celery-leader[console]'", install
    assert console.startswith("celery -A proj leader console  "), console
    served = spawn(procs, console.split("  #")[0] + " --port 0", tmp_path, redis)
    url = served.wait_for_line(r"console at (http://127\.0\.0\.1:\d+/) \(read-only", 60)[1]

    def holder() -> str | None:
        rows = requests.get(url + "api/cluster", timeout=10).json()["elections"]
        return next((row["holder"] for row in rows if row["election"] == "beat"), None)

    # beat starts and wins the free lease in a few seconds: 30 s is for a loaded machine.
    wait_for(holder, 30, interval=0.5, message=lambda: f"nobody led:\n{beat.output()}")
    assert str(holder()).endswith(f":{beat.pid}"), holder()
    page = requests.get(url, timeout=10)
    assert page.status_code == 200 and str(holder()) in page.text
