"""Python subprocesses for chaos tests: own process group, output in a log file.

Each process leads a new session, so signalling its group reaches everything it forked
(a celery worker's pool, say) and teardown leaves nothing behind.
"""

from __future__ import annotations

import os
import re
import signal as _signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from .waiting import wait_for


class Proc:
    """A running Python subprocess whose stdout and stderr go to ``log_path``."""

    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.popen = popen
        self.log_path = log_path
        #: Whether it was asked to stop (SIGTERM or SIGINT): teardown finds out why
        #: one that is still running did not (see :meth:`kill_group`).
        self.asked_to_stop = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def lines(self) -> list[str]:
        return self.output().splitlines()

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match[str]:
        """First output line matching the regex ``pattern``; fails with the log if none."""
        regex = re.compile(pattern)

        def find() -> re.Match[str] | None:
            for line in self.lines():
                match = regex.search(line)
                if match:
                    return match
            return None

        return wait_for(
            find,
            timeout,
            interval=0.05,
            message=lambda: (
                f"no line matching {pattern!r} from pid {self.pid}; output so far:\n{self.output()}"
            ),
        )

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def signal(self, sig: int, *, group: bool = True) -> None:
        """Send ``sig`` to the process's whole group (default) or to the process alone.

        Group delivery is what a crash or a service manager does; a process that
        already exited (and everything it forked) is not an error.

        Once the process is reaped, its pid is free: with ``pid_max`` 32768 and
        thousands of forks a minute (a full run wraps it every few minutes), the
        kernel soon gives it to another process, and a signal to the reaped one's
        group then reached a PostgreSQL server another test process had started in
        a session of its own (postmaster and backends: "terminating connection due
        to administrator command"). So a reaped process is not signalled, and its
        group only while no process holds its pid: then the group is its orphans
        (a group's id is not reused while a member lives), or nothing.
        """
        if sig in (_signal.SIGTERM, _signal.SIGINT):
            self.asked_to_stop = True
        if self.popen.returncode is not None:
            if group:
                signal_orphans(self.pid, sig)
            return  # reaped: that pid is another process's, or nobody's
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill_group(self) -> None:
        """SIGKILL the process and all it forked (stopped ones too), then reap it.

        One that was asked to stop and still runs is hung: it first gets SIGABRT
        alone, so that Python's fault handler (on in every process started here)
        writes each of its threads' stacks to its log.
        """
        if self.asked_to_stop and self.alive:
            self.signal(_signal.SIGCONT, group=False)
            self.signal(_signal.SIGABRT, group=False)
            try:
                self.popen.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
        self.signal(_signal.SIGKILL)
        self.popen.wait()

    def __repr__(self) -> str:
        return f"<Proc pid={self.pid} returncode={self.popen.returncode} log={self.log_path}>"


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    log_path: Path,
) -> Proc:
    """Start ``argv`` leading a new session (so one ``killpg`` reaches all it forks),
    output appended to ``log_path``.

    ``env`` is added to a copy of this process's environment, with unbuffered
    Python output so that lines show up in the log as they are printed, and
    Python's fault handler on (a hung process's stacks on SIGABRT).
    """
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    return Proc(popen, log_path)


def spawn_python(
    code_or_script_path: str | Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    log_dir: str | Path | None = None,
) -> Proc:
    """Start ``sys.executable`` on a script (a Path, or a str naming an existing file) or
    on code given as a string (``python -c``), logging to a new file in ``log_dir``."""
    if isinstance(code_or_script_path, Path) or os.path.isfile(code_or_script_path):
        argv = [sys.executable, str(code_or_script_path), *args]
    else:
        argv = [sys.executable, "-c", code_or_script_path, *args]
    fd, log_name = tempfile.mkstemp(prefix="proc-", suffix=".log", dir=log_dir)
    os.close(fd)
    return start(argv, env=env, cwd=cwd, log_path=Path(log_name))


def pid_exists(pid: int) -> bool:
    """Whether a process (a zombie too) has ``pid``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_orphans(pid: int, sig: int) -> None:
    """Send ``sig`` to what a reaped group leader ``pid`` left behind in its group: only
    while no process holds ``pid`` (see :meth:`Proc.signal`), as another may by now."""
    if pid_exists(pid):
        return
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def signal(proc: Proc, sig: int, *, group: bool = True) -> None:
    """``proc.signal(sig, group=group)``, for tests that name the signal they send."""
    proc.signal(sig, group=group)


class Procs:
    """What the ``procs`` fixture gives: spawns processes and kills them all at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Proc] = []

    def spawn_python(
        self,
        code_or_script_path: str | Path,
        *args: str,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> Proc:
        proc = spawn_python(code_or_script_path, *args, env=env, cwd=cwd, log_dir=self.log_dir)
        self.started.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.started:
            # SIGKILL reaches stopped (SIGSTOP) processes too, so no SIGCONT is needed.
            proc.kill_group()
            # Printed so that pytest shows each process's last words when a test fails.
            print(f"--- {proc!r}, last lines:")
            lines = proc.lines()
            dumped = any(line.startswith("Fatal Python error: Aborted") for line in lines)
            print("\n".join(lines[-150:] if dumped else lines[-30:]))
