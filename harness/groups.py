"""Process groups of the benchmarks: started with :func:`harness.procs.start`, all killed at
the end, and inspected through ``/proc`` (liveness, CPU time).

Every beat replica, single-beat wrapper and lease-holder process is started in a
new session, so one ``killpg`` reaches whatever it forked (single-beat's
``celery beat`` child, for one) and nothing outlives the benchmark.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from .procs import Proc, start

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"


def start_child(argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> Proc:
    """Start a benchmark process (repository on its ``PYTHONPATH``) that :func:`kill_all` ends."""
    child = start(argv, env={"PYTHONPATH": str(ROOT), **env}, cwd=cwd, log_path=log_path)
    _ALL.append(child)
    return child


_ALL: list[Proc] = []


def kill_all() -> None:
    """Kill every process group any benchmark started, including those that already exited:
    a dead group leader may have left children (single-beat's beat) behind."""
    for child in _ALL:
        child.kill_group()
    _ALL.clear()


def _fields(stat: str) -> list[str]:
    # The command name may contain spaces and parentheses; fields resume after the last ")".
    # Index 0 is the state, 2 the process group, 3 the session, 11-14 utime, stime, cutime, cstime.
    return stat[stat.rindex(")") + 2 :].split()


def _all_stats() -> Iterator[tuple[int, list[str]]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), _fields((entry / "stat").read_text())
            except OSError:
                continue  # exited while we looked


def pgrp_of(pid: int) -> int | None:
    """Process group of ``pid``, or ``None`` once it is gone."""
    try:
        return int(_fields(Path(f"/proc/{pid}/stat").read_text())[2])
    except OSError:
        return None


def group_alive(pgid: int) -> bool:
    """True while any process of the group is alive (zombies aside)."""
    return any(int(f[2]) == pgid and f[0] != "Z" for _, f in _all_stats())


def group_cpu_seconds(pgid: int) -> float:
    """CPU time used by the live members of a process group plus the children they reaped.

    PostgreSQL's postmaster reaps every backend that exits, so their CPU lands in
    its cutime and cstime.
    """
    ticks = sum(sum(int(x) for x in f[11:15]) for _, f in _all_stats() if int(f[2]) == pgid)
    return ticks / os.sysconf("SC_CLK_TCK")


def session_members(sid: int) -> list[int]:
    """The live processes (zombies aside) of session ``sid``, ``sid`` itself included."""
    return sorted(pid for pid, f in _all_stats() if int(f[3]) == sid and f[0] != "Z")
