"""The guard: the one process between ``leader run`` and the command it runs.

``python guard.py FD DEADLINE GRACE SLACK -- CMD...``, in a session of its own, runs CMD
in a new process group (with a parent-death SIGKILL) and stops the whole group:

* when the runner asks (``S <signal>`` on FD): that signal, SIGKILL after GRACE;
* when the last lease deadline sent (``D <monotonic time>``) comes within GRACE + SLACK:
  the same, on its own, so a paused or cut-off runner still has its child stopped
  before another replica's lease can begin;
* when the socket closes (the runner died): SIGKILL at once.

It exits with CMD's status (128 + N for signal N), reporting ``F`` first when the
deadline stopped CMD. Standard library only, run as a script: a new child is not held
up by importing celery-leader.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1

#: Longest wait in one select, so a lost wake-up costs at most this.
_POLL = 0.5


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _child_setup(guard_pid: int) -> None:
    """In the child, before exec: a process group of its own (which Popen returns
    after, so the guard never signals a group that does not exist yet), and SIGKILL
    when the guard dies, even if it died already."""
    os.setpgid(0, 0)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != guard_pid:  # the guard died before prctl took effect
        os._exit(1)


class Guard:
    """Runs ``command`` and stops its process group on request, on the deadline or on EOF."""

    def __init__(
        self, chan: socket.socket, deadline: float, grace: float, slack: float, command: list[str]
    ) -> None:
        self.chan = chan
        self.deadline = deadline
        self.grace = grace
        self.slack = slack
        guard_pid = os.getpid()
        self.child = subprocess.Popen(command, preexec_fn=lambda: _child_setup(guard_pid))
        self.pidfd = os.pidfd_open(self.child.pid)
        self._buffer = b""

    def run(self) -> int:
        """Supervise until the child has exited; return the guard's exit status."""
        while not self._exited():
            fence_at = self.deadline - self.grace - self.slack
            timeout = min(max(fence_at - time.monotonic(), 0.0), _POLL)
            readable, _, _ = select.select([self.chan.fileno(), self.pidfd], [], [], timeout)
            if self.chan.fileno() in readable and not self._read():
                self._signal_group(signal.SIGKILL)  # the runner is gone
                break
            if self._exited():
                break
            if time.monotonic() >= self.deadline - self.grace - self.slack:
                self._report(b"F\n")
                self._stop(signal.SIGTERM)
        # Whatever the child left in its group dies with it: nothing of a term
        # may run on after the term. Then the child is reaped (see _exited).
        self._signal_group(signal.SIGKILL)
        code = int(self.child.wait())
        return 128 - code if code < 0 else code

    def _exited(self) -> bool:
        """Whether the child has exited, without reaping it. Unreaped, its pid, which is
        its group's id, goes to no other process, so a signal to the group reaches only
        what the child left in it. A reaped child's pid is free: a busy host hands it out
        again within minutes, and the new process may lead a group of its own (any
        daemon, or a server started in a session of its own), which a killpg would hit."""
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self.child.pid, flags) is not None

    def _read(self) -> bool:
        """Take the runner's messages; False once it has gone."""
        try:
            data = self.chan.recv(4096)
        except OSError:
            return False
        if not data:
            return False
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            kind, _, value = line.decode().partition(" ")
            if kind == "D":
                self.deadline = float(value)
            elif kind == "S":
                self._stop(signal.Signals(int(value)))
        return True

    def _stop(self, sig: signal.Signals) -> None:
        """``sig`` to the group, SIGKILL after the grace (sooner if the deadline says so)."""
        self._signal_group(sig)
        until = min(time.monotonic() + self.grace, self.deadline - self.slack)
        while not self._exited():
            left = until - time.monotonic()
            if left <= 0:
                break
            select.select([self.pidfd], [], [], left)
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.child.pid, sig)
        except ProcessLookupError:
            pass  # nothing of the group is left

    def _report(self, message: bytes) -> None:
        try:
            self.chan.sendall(message)
        except OSError:
            pass  # the runner is gone; the EOF is seen next


def main(argv: list[str]) -> int:
    """``FD DEADLINE GRACE SLACK -- CMD...``: see the module docstring."""
    fd, deadline, grace, slack, dashes, *command = argv
    if dashes != "--" or not command:
        print("usage: guard.py FD DEADLINE GRACE SLACK -- CMD...", file=sys.stderr)
        return 2
    chan = socket.socket(fileno=int(fd))
    try:
        guard = Guard(chan, float(deadline), float(grace), float(slack), command)
    except OSError as exc:
        print(f"celery-leader run: cannot execute {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return guard.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
