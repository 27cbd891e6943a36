"""``leader run``: campaign, and run a command only while leading.

While leading, one guard (:mod:`celery_leader.run.guard`) runs the command and is sent
every new lease deadline. A demotion stops the command inside the demotion callback,
before the lease releases its term, so the term is free only after the command is gone.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from ..election.events import Callbacks
from ..election.lease import Lease
from ..election.lease_set import lease_set
from ..exceptions import ConfigError
from ..probes import http as http_health
from ..probes.health import HealthFile
from ..settings.config import LeaderConfig
from . import guard as guard_module
from .spec import RunSpec
from .timing import KILL_SLACK

logger = logging.getLogger("celery_leader.run")

#: How often the runner passes the lease deadline on to the guard. The guard
#: acts on the deadline it last got, which is earlier than the real one, so a
#: late message only makes it stop the command sooner, never later.
FEED_INTERVAL = 0.05

#: Pause before a command that exited is started again (``--restart``), so a
#: command that fails at once does not spin.
RESTART_DELAY = 1.0

#: Signals that stop the runner: forwarded to the command, then the lease is released.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Child:
    """One guard process and the runner's end of its socket."""

    def __init__(self, spec: RunSpec, epoch: int, deadline: float, on_exit: threading.Event):
        ours, theirs = socket.socketpair()
        env = {**os.environ, "LEADER_EPOCH": str(epoch), "LEADER_ELECTION": spec.election}
        guard = [sys.executable, str(Path(guard_module.__file__)), str(theirs.fileno())]
        argv = [*guard, repr(deadline), repr(spec.grace), repr(KILL_SLACK), "--", *spec.command]
        try:
            # A session of its own: signals meant for the runner's group (a
            # terminal's Ctrl-C, a SIGSTOP of the group) do not reach the guard.
            self.proc = subprocess.Popen(
                argv, env=env, pass_fds=(theirs.fileno(),), start_new_session=True
            )
        finally:
            theirs.close()
        self.chan = ours
        self.epoch = epoch
        self.started = time.time()
        self.fenced = False
        self._sent_deadline = deadline
        threading.Thread(target=self._wait, args=(on_exit,), daemon=True).start()

    def _wait(self, on_exit: threading.Event) -> None:
        self.proc.wait()
        on_exit.set()

    def feed(self, deadline: float) -> None:
        """Tell the guard a new lease deadline (only a later one is news)."""
        if deadline > self._sent_deadline:
            self._send(f"D {deadline!r}\n")
            self._sent_deadline = deadline

    def stop(self, sig: int, timeout: float) -> None:
        """Ask the guard to stop the command with ``sig``; wait until it has exited."""
        self._send(f"S {int(sig)}\n")
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # The guard is stuck (paused?): closing the socket makes it SIGKILL
            # the group the moment it runs again; killing it fires the child's
            # parent-death signal.
            self.proc.kill()
            self.proc.wait()
        self.close()

    def exit_status(self) -> int | None:
        """The guard's exit status once it exited, reading whether it fenced."""
        code = self.proc.poll()
        if code is not None:
            try:
                self.chan.setblocking(False)
                self.fenced = b"F" in self.chan.recv(64)
            except OSError:
                pass
        return code

    def close(self) -> None:
        """Close the runner's end: a guard still running kills the group at once."""
        self.chan.close()

    def _send(self, message: str) -> None:
        try:
            self.chan.sendall(message.encode())
        except OSError:
            pass  # the guard exited; its exit is handled by the main loop


class Runner:
    """Campaigns for ``spec.election`` and runs ``spec.command`` while leading."""

    def __init__(self, config: LeaderConfig, spec: RunSpec) -> None:
        self.config = config
        self.spec = spec
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._child: _Child | None = None
        self._stop_signal: int | None = None
        self._rest_until = 0.0

    def run(self) -> int:
        """Until a stop signal or the command's final exit; the exit status. Raises
        :class:`ConfigError` before campaigning when the health port is taken."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        seen = http_health.LeaderSeen()
        told = Callbacks(self._on_started, self._on_stopped, on_new_leader=seen)
        membership = lease_set(self.config).join(self.spec.election, callbacks=told, start=False)
        lease = membership.lease
        health = None
        if self.config.health_port is not None:
            # Rewritten by the main loop: a runner that hangs shows as stale.
            health = HealthFile(None, lease)
            try:
                http_health.serve(self.config.health_port, health, seen)
            except OSError as exc:
                membership.leave()
                raise ConfigError(
                    f"leader_health_port {self.config.health_port}: cannot listen: {exc}"
                ) from exc
        lease.start()  # the endpoint answers from the start of the campaign
        msg = "celery-leader run: %s campaigns for %r on %s to run %s"
        where = (self.spec.election, self.config.display_url, shlex.join(self.spec.command))
        logger.info(msg, self.config.instance_id, *where)
        try:
            code = self._loop(lease, health)
        finally:
            self._stop_child(self._stop_signal or signal.SIGTERM)
            # Released only now, when the command is gone: another replica
            # starts its own at once instead of after the ttl.
            membership.leave()
        return code

    def _loop(self, lease: Lease, health: HealthFile | None) -> int:
        while self._stop_signal is None:
            self._wake.wait(FEED_INTERVAL)
            self._wake.clear()
            if self._stop_signal is not None:
                break
            if health is not None:
                health.write(force=False)
            with self._lock:
                child = self._child
                if child is None:
                    self._maybe_start(lease)
                    continue
                code = child.exit_status()
                if code is None:
                    child.feed(lease.valid_until)
                    continue
                self._child = None
                child.close()
            if child.fenced:
                msg = "celery-leader run: stopped %s: no renewal of %r confirmed in time"
                logger.warning(msg, shlex.join(self.spec.command), self.spec.election)
                continue  # the lease decides whether it still leads
            if self._restarts(code):
                msg = "celery-leader run: the command exited with %d; restarting in %g s"
                logger.warning(msg, code, RESTART_DELAY)
                self._rest_until = time.monotonic() + RESTART_DELAY
                continue
            msg = "celery-leader run: the command exited with %d; leaving %r"
            logger.info(msg, code, self.spec.election)
            return code
        return 0

    def _restarts(self, code: int) -> bool:
        return self.spec.restart == "always" or (self.spec.restart == "on-failure" and code != 0)

    def _maybe_start(self, lease: Lease) -> None:
        """Start the command if this instance leads with time to spare (lock held)."""
        now = time.monotonic()
        if now < self._rest_until:
            return
        epoch, deadline = lease.epoch, lease.valid_until
        if epoch is None or deadline - now <= self.spec.grace + KILL_SLACK:
            return
        self._child = _Child(self.spec, epoch, deadline, self._wake)
        msg = "celery-leader run: %s leads %r (epoch %d): started %s (guard pid %d)"
        command, pid = shlex.join(self.spec.command), self._child.proc.pid
        logger.info(msg, self.config.instance_id, self.spec.election, epoch, command, pid)

    def _on_started(self, lease: Lease) -> None:
        self._wake.set()  # the main loop starts the command

    def _on_stopped(self, lease: Lease) -> None:
        # In the lease thread, before the demoted lease releases its term: the
        # command must be gone before anyone else can be elected.
        self._stop_child(signal.SIGTERM)
        self._wake.set()

    def _stop_child(self, sig: int) -> None:
        with self._lock:
            child, self._child = self._child, None
            if child is not None:
                child.stop(sig, self.spec.grace + KILL_SLACK + 1.0)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum
        self._wake.set()
