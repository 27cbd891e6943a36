"""Three singleton runners around one command, and the faults the singleton tests apply.

Used by ``tests/test_run_singleton.py`` (a few faults, ``leader run`` on Redis)
and ``benchmarks/singleton.py`` (20 faults, Redis, PostgreSQL, etcd and
single-beat). Every runner wraps :mod:`harness.singleton_child`, which appends
``pid epoch start now`` to one shared file every 50 ms; the lifetimes read back
from it show overlap and hand-over, and ``/proc`` shows what is still alive.

Each runner reaches the store through TCP proxies of its own (one per etcd
member), so one runner's link can be cut while the others' stay up.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .groups import VENV_BIN
from .procs import Proc, start
from .proxy import TcpProxy

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "singleton_child.py"

#: The faults, applied in turn to the runner whose child is running.
FAULTS = ("sigkill", "sigstop", "cut")


@dataclass
class Life:
    """One child's lifetime as its records show it (monotonic seconds)."""

    pid: int
    epoch: str
    start: float
    last: float


def lifetimes(path: Path) -> list[Life]:
    """Every child that wrote to ``path``, by start."""
    lives: dict[int, Life] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 4:
                continue  # a line cut short by SIGKILL mid-write
            pid, epoch, begun, now = int(parts[0]), parts[1], float(parts[2]), float(parts[3])
            life = lives.setdefault(pid, Life(pid, epoch, begun, now))
            life.last = max(life.last, now)
    return sorted(lives.values(), key=lambda life: life.start)


def overlaps(lives: list[Life]) -> list[tuple[Life, Life]]:
    """Pairs of children that both wrote at some moment: the later started before the
    earlier's last record."""
    return [(a, b) for i, a in enumerate(lives) for b in lives[i + 1 :] if b.start < a.last]


def _stat(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie is dead)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def runs_child(pid: int, records: Path) -> bool:
    """True while ``pid`` is a :mod:`harness.singleton_child` writing to ``records``.

    A pid read back from the records may be another process's by now: pid_max
    (32768) wraps every few minutes on a busy host, and the new owner may be
    anything, another test process's PostgreSQL server included.
    """
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(CHILD).encode() in argv and str(records).encode() in argv


def ancestors(pid: int) -> list[int]:
    """``pid``'s parent, grandparent, ... up to init."""
    chain = []
    while True:
        fields = _stat(pid)
        if fields is None or int(fields[1]) <= 1:
            return chain
        pid = int(fields[1])
        chain.append(pid)


def wait_until(predicate: Callable[[], object], timeout: float, step: float = 0.01) -> float | None:
    """Seconds until ``predicate()`` held, or ``None`` after ``timeout``."""
    begun = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - begun
        if time.monotonic() - begun > timeout:
            return None
        time.sleep(step)


@dataclass
class Runner:
    """One replica: a runner process and its store proxies."""

    proc: Proc
    proxies: list[TcpProxy]


@dataclass
class Outcome:
    """What one fault did."""

    fault: str
    #: Seconds from the fault until the old child was gone (None: it never went).
    old_gone: float | None
    #: Seconds from the fault until a new child wrote its first record.
    new_start: float | None
    #: Seconds between the old child's last record and the new child's start.
    gap: float | None


@dataclass
class Fleet:
    """``count`` runners of ``kind`` (``"leader"`` or ``"single-beat"``) on one store."""

    kind: str
    store_ports: list[int]
    #: Builds the store URL from this runner's proxies.
    url_via: Callable[[list[TcpProxy]], str]
    workdir: Path
    ttl: float
    grace: float
    count: int = 3
    election: str = "singleton"
    runners: list[Runner] = field(default_factory=list)
    retired: list[Runner] = field(default_factory=list)

    @property
    def records(self) -> Path:
        return self.workdir / "children.log"

    def spawn(self) -> Runner:
        proxies = [TcpProxy("127.0.0.1", port) for port in self.store_ports]
        url = self.url_via(proxies)
        child = [sys.executable, str(CHILD), str(self.records)]
        env = {"PYTHONPATH": str(ROOT)}
        if self.kind == "leader":
            argv = [sys.executable, "-m", "celery_leader", "run", "--election", self.election]
            argv += ["--url", url, "--ttl", str(self.ttl), "--grace", str(self.grace), "--"]
        else:
            argv = [str(VENV_BIN / "single-beat")]
            env |= {
                "SINGLE_BEAT_REDIS_SERVER": url,
                "SINGLE_BEAT_LOCK_TIME": str(int(self.ttl)),
                # Must be below LOCK_TIME / 2, and it is an integer: 1 s is the fastest.
                "SINGLE_BEAT_HEARTBEAT_INTERVAL": "1",
                "SINGLE_BEAT_IDENTIFIER": self.election,
            }
        log = self.workdir / f"runner{len(self.runners) + len(self.retired)}.log"
        runner = Runner(start([*argv, *child], env=env, cwd=ROOT, log_path=log), proxies)
        self.runners.append(runner)
        return runner

    def top_up(self) -> None:
        """Replace the runners that were killed; return once every one campaigns."""
        while len(self.runners) < self.count:
            self.spawn()
        for runner in self.runners:
            if self.kind == "leader":
                runner.proc.wait_for_line("campaigns for", timeout=30)

    def running(self) -> Life | None:
        """The child writing now (a record within the last 0.2 s), if exactly one is."""
        now = time.monotonic()
        recent = [life for life in lifetimes(self.records) if now - life.last < 0.2]
        return recent[0] if len(recent) == 1 and alive(recent[0].pid) else None

    def runner_of(self, pid: int) -> Runner | None:
        chain = ancestors(pid)
        return next((r for r in self.runners if r.proc.pid in chain), None)

    def reset(self) -> None:
        """Kill every runner, its group and every child, and start afresh."""
        for runner in self.runners:
            runner.proc.kill_group()
        for pid in self.orphans():
            os.kill(pid, signal.SIGKILL)
        self.retired += self.runners
        self.runners = []
        self.top_up()

    def steady(self, timeout: float = 30.0) -> tuple[Runner, Life]:
        """Until one child runs, under one of the live runners, for 0.3 s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            life = self.running()
            runner = None if life is None else self.runner_of(life.pid)
            if life is not None and runner is not None and life.last - life.start > 0.3:
                return runner, life
            time.sleep(0.05)
        raise AssertionError(f"{self.kind}: no single child running steadily")

    def fault(self, fault: str) -> Outcome:
        """Apply ``fault`` to the runner of the running child; measure the hand-over."""
        runner, old = self.steady()
        began = time.monotonic()

        def new_child() -> Life | None:
            return next((x for x in lifetimes(self.records) if x.start > began), None)

        if fault == "sigkill":
            runner.proc.signal(signal.SIGKILL, group=False)
            self.runners.remove(runner)
            self.retired.append(runner)
        elif fault == "sigstop":
            runner.proc.signal(signal.SIGSTOP, group=False)
        else:
            for proxy in runner.proxies:
                proxy.hold()
        # Both waits start at the fault: the old child may outlive the new one's start.
        old_gone = wait_until(lambda: not alive(old.pid), self.ttl + 2)
        wait_until(new_child, max(0.0, began + 3 * self.ttl + 5 - time.monotonic()))
        if fault == "sigkill":
            # What a container runtime or systemd does once the main process died:
            # kill its process group (single-beat's child is in it; a guard is not).
            # Half a second after the new child started, so that an orphan shows.
            time.sleep(0.5)
            runner.proc.kill_group()
        elif fault == "sigstop":
            runner.proc.signal(signal.SIGCONT, group=False)
        else:
            for proxy in runner.proxies:
                proxy.release()
        new = new_child()
        before = [life.last for life in lifetimes(self.records) if life.start <= began]
        self.top_up()
        return Outcome(
            fault,
            old_gone,
            None if new is None else new.start - began,
            None if new is None else new.start - max(before),
        )

    def stop(self) -> None:
        """SIGTERM every runner (as a service manager does) and reap it."""
        for runner in self.runners:
            runner.proc.signal(signal.SIGTERM, group=False)
        for runner in self.runners:
            try:
                runner.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                runner.proc.kill_group()

    def orphans(self) -> list[int]:
        """Children still alive although every runner is gone (their pids, still theirs)."""
        return [
            life.pid
            for life in lifetimes(self.records)
            if alive(life.pid) and runs_child(life.pid, self.records)
        ]

    def close(self) -> None:
        for runner in self.runners + self.retired:
            runner.proc.kill_group()
            for proxy in runner.proxies:
                proxy.close()
        for pid in self.orphans():
            os.kill(pid, signal.SIGKILL)


def summary(outcomes: list[Outcome]) -> dict[str, str]:
    """Median and worst of each measure over ``outcomes``."""

    def stats(values: list[float | None]) -> str:
        known = [v for v in values if v is not None]
        missing = len(values) - len(known)
        if not known:
            return "never" if values else "-"
        text = f"{statistics.median(known):.2f} / {max(known):.2f} s"
        return text + (f" ({missing} never)" if missing else "")

    return {
        "old child gone (median / max)": stats([o.old_gone for o in outcomes]),
        "new child started": stats([o.new_start for o in outcomes]),
        "gap": stats([o.gap for o in outcomes]),
    }
