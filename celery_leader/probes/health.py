"""Health of a process that takes part in an election, for liveness probes: a tick
:class:`Watchdog` and a :class:`ConsumerLiveness` (each a lease's ``health_check``: a
leader whose loop hangs, or whose consumer is cut off, hands over), and the
:class:`HealthFile` that ``leader check`` (:func:`check`) and ``/healthz`` judge.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..election.lease import Lease

#: A tick rewrites the file at most this often unless something else changed
#: (a follower ticks ten times a second). The deadline written is then up to
#: this much older, and so earlier than the real one: never a false pass.
MIN_REWRITE = 0.5


class Watchdog:
    """The deadline by which the loop must finish a tick; ``timeout`` seconds of slack.

    Before the first tick the deadline is ``timeout`` after construction. A
    tick that starts moves it to ``timeout`` from then; a tick that finishes and
    asks to sleep ``s`` seconds moves it to ``s + timeout`` from then.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._deadline = time.monotonic() + timeout
        self.last_tick: float | None = None  # time.time() of the last finished tick

    def tick_started(self) -> None:
        """The loop starts a tick now."""
        self._deadline = time.monotonic() + self.timeout

    #: A long tick made progress (a chunk of a new term's state is loaded): a tick that
    #: keeps making progress is not hung, and one stuck in a single step still is.
    progress = tick_started

    def tick_finished(self, sleep: float) -> None:
        """The loop finished a tick and will start the next within ``sleep`` seconds."""
        self._deadline = time.monotonic() + max(sleep, 0.0) + self.timeout
        self.last_tick = time.time()

    def remaining(self) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return self._deadline - time.monotonic()

    def overdue(self) -> str | None:
        """Why the loop counts as hung, or ``None`` while it keeps its deadline."""
        late = -self.remaining()
        if late <= 0:
            return None
        return (
            f"the scheduler has not finished a tick for {self.timeout + late:.1f} s "
            f"(leader_tick_timeout {self.timeout:g} s)"
        )


class ConsumerLiveness:
    """Whether a broker consumer reached its broker within ``grace`` seconds.

    Told by events (Celery's consumer steps) or heartbeats (Dramatiq's consumer
    loop). It starts cut off: a consumer that never reaches the broker must not
    let its process lead. Shorter outages (a reconnect) keep the lead.
    """

    def __init__(self, name: str, grace: float) -> None:
        #: What the reason names: the consumer of what.
        self.name = name
        self.grace = grace
        # Since when nothing told that the consumer reaches the broker; None
        # while it is connected (no heartbeat needed).
        self._silent_since: float | None = time.monotonic()

    def alive(self) -> None:
        """The consumer reached the broker just now (a heartbeat)."""
        self._silent_since = time.monotonic()

    def connected(self) -> None:
        """The consumer is connected and consuming, until :meth:`disconnected`."""
        self._silent_since = None

    def disconnected(self) -> None:
        """The consumer lost its broker connection."""
        if self._silent_since is None:
            self._silent_since = time.monotonic()

    def problem(self) -> str | None:
        """Why this consumer counts as cut off from the broker, or ``None``."""
        since = self._silent_since
        if since is None:
            return None
        silent = time.monotonic() - since
        if silent <= self.grace:
            return None
        return f"{self.name} has not reached the broker for {silent:.1f} s"


class HealthFile:
    """Writes ``path`` atomically with the health of ``lease`` (and of ``watchdog``'s loop).

    Thread-safe. A write that fails (a full disk) leaves the file to go stale, which
    the probe reports. With ``path=None`` the record is only kept as :attr:`latest`.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, lease: Lease, watchdog: Watchdog | None = None
    ) -> None:
        self.path = None if path is None else Path(path)
        self.lease = lease
        self.watchdog = watchdog
        #: What the last :meth:`write` recorded (``None`` before the first).
        self.latest: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._last_write = 0.0
        self._last_facts: tuple[Any, ...] = ()
        self._written_deadline = 0.0  # monotonic tick deadline in the file

    def snapshot(self) -> dict[str, Any]:
        """What the file holds: see docs/operations.md for each field."""
        lease = self.lease
        now = time.time()
        epoch = lease.epoch
        data: dict[str, Any] = {
            "election": lease.election,
            "instance": lease.instance_id,
            "pid": os.getpid(),
            "role": "leader" if epoch is not None else "follower",
            "epoch": epoch,
            "store_reachable": lease.store_reachable,
            # The store's clock minus this host's (None: not measured, or no store clock).
            "clock_offset": lease.store_clock.offset,
            # Why this host does not lead although healthy (its clock), or None.
            "clock_problem": lease.clock_problem,
            "updated": now,
            # Lease cycles come at least every ttl (a follower's longest wait)
            # plus one renew interval: later than this the writer is stuck.
            "stale_after": now + 2 * lease.ttl + lease.renew_interval,
            "last_tick": None,
            "tick_due_by": None,
        }
        if self.watchdog is not None:
            data["last_tick"] = self.watchdog.last_tick
            data["tick_due_by"] = now + self.watchdog.remaining()
        return data

    def write(self, *, force: bool = True) -> None:
        """Rewrite the file; with ``force=False`` skip it if only times changed lately
        and the tick deadline in the file is not about to pass."""
        data = self.snapshot()
        facts = (data["role"], data["epoch"], data["store_reachable"], data["clock_problem"])
        with self._lock:
            now = time.monotonic()
            deadline = now + (self.watchdog.remaining() if self.watchdog is not None else 0.0)
            if (
                not force
                and facts == self._last_facts
                and now - self._last_write < MIN_REWRITE
                and (self.watchdog is None or self._written_deadline - now > MIN_REWRITE)
            ):
                return
            self._last_write, self._last_facts = now, facts
            self._written_deadline = deadline
            self.latest = data
            if self.path is None:
                return
            with contextlib.suppress(OSError):
                _atomic_write(self.path, json.dumps(data))


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check(path: str | os.PathLike[str], max_age: float | None = None) -> tuple[bool, str]:
    """Read a health file: ``(healthy, one line saying why)`` (see :func:`judge`)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return False, f"UNHEALTHY: no health file at {path}"
    except (OSError, ValueError) as exc:
        return False, f"UNHEALTHY: unreadable health file {path}: {exc}"
    return judge(data, str(path), max_age)


def judge(data: Any, source: str, max_age: float | None = None) -> tuple[bool, str]:
    """Judge a health record (``source`` names it in the line): ``(healthy, one line)``.

    Unhealthy when unreadable, older than ``max_age`` (default: its ``stale_after``)
    or with the tick overdue. A store outage alone is healthy: restarting the
    process would not bring the store back.
    """
    try:
        updated = float(data["updated"])
        stale_after = float(data["stale_after"])
        role, election = str(data["role"]), str(data["election"])
    except (ValueError, TypeError, KeyError) as exc:
        return False, f"UNHEALTHY: unreadable health record {source}: {exc}"
    now = time.time()
    age = now - updated
    if max_age is not None and age > max_age:
        return False, (
            f"UNHEALTHY: {source} was last written {age:.1f} s ago (max age {max_age:g} s)"
        )
    if max_age is None and now > stale_after:
        return False, (
            f"UNHEALTHY: {source} was last written {age:.1f} s ago: the process stopped updating it"
        )
    due_by = data.get("tick_due_by")
    if due_by is not None and now > float(due_by):
        last = data.get("last_tick")
        since = "never" if last is None else f"{now - float(last):.1f} s ago"
        return False, f"UNHEALTHY: the scheduler's tick is overdue (last finished {since})"
    epoch = data.get("epoch")
    what = f"{role} of {election!r}" + (f" (epoch {epoch})" if role == "leader" else "")
    store = "store reachable" if data.get("store_reachable") else "store UNREACHABLE"
    last = data.get("last_tick")
    tick = "" if last is None else f", last tick {now - float(last):.1f} s ago"
    return True, f"OK: {what}{tick}, {store}"
