"""Real processes on a fake wall clock: libfaketime, driven from the test.

Each clock is an offset file that libfaketime reads on every call
(``FAKETIME_TIMESTAMP_FILE`` with ``FAKETIME_NO_CACHE=1``). A thread of the test
rewrites the files every :data:`STEP` seconds so that the fake time runs
``speed`` times faster than real time from ``start``. Why not libfaketime's own
``x60`` speed-up: it also divides every ``poll``/``select`` timeout by the rate
(a Redis client's 1 s socket timeout becomes 17 ms) and it starts each process's
clock when that process starts, so replicas would disagree. With offsets, every
process on one clock reads the same time, timeouts stay real, and the fake time
never goes back unless a test shifts a clock on purpose.

Monotonic time stays real (``FAKETIME_DONT_FAKE_MONOTONIC=1``): leases and their
ttl run on it, as in production, where NTP steps the wall clock but not that.
Between two rewrites the fake clock runs at real speed, then steps forward by
``(speed - 1) * STEP``: a staircase, at most 1.2 s of fake time at x60.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from .waiting import wait_for

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
#: Holds the ``sitecustomize`` that works around libfaketime's ``clock_nanosleep``.
SITE = Path(__file__).resolve().parent / "faketime_site"
#: How often the offset files are rewritten (real seconds).
STEP = 0.02


class FakeClock:
    """Fake wall clocks for child processes: one shared time, plus per-clock shifts.

    ``env(name)`` is what a process needs to run on clock ``name``; every clock
    reads :meth:`now` plus its own shift (:meth:`shift`), so ``"main"`` and a
    clock shifted by ten minutes keep their distance as time runs. Time stands
    still at ``start`` until :meth:`run`: processes start up (seconds, on a busy
    machine) without using up fake time.
    """

    def __init__(self, directory: Path, start: datetime, speed: float) -> None:
        if not LIBFAKETIME.exists():
            raise RuntimeError(f"{LIBFAKETIME} is missing: apt-get install faketime")
        self.directory = directory
        self.start = start.astimezone(timezone.utc)
        self.speed = speed
        self._origin: float | None = None  # when the clock started running
        self._shifts: dict[str, timedelta] = {"main": timedelta(0)}
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # the thread and shift() both rewrite the files
        self._stopping = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._run, name="fake-clock", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """Let time run, ``speed`` times faster than real time."""
        self._origin = time.monotonic()

    def now(self, name: str = "main") -> datetime:
        """The fake time of clock ``name`` (aware UTC)."""
        origin = self._origin
        elapsed = 0.0 if origin is None else (time.monotonic() - origin) * self.speed
        with self._lock:
            shift = self._shifts.get(name, timedelta(0))
        return self.start + timedelta(seconds=elapsed) + shift

    def env(self, name: str = "main") -> dict[str, str]:
        """Environment of a Python process on clock ``name`` (created unshifted if new)."""
        with self._lock:
            self._shifts.setdefault(name, timedelta(0))
        self._write()
        return {
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME_TIMESTAMP_FILE": str(self._path(name)),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            # Log lines in UTC: the fake time, readable next to slot names.
            "TZ": "UTC",
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(SITE), os.environ.get("PYTHONPATH"), str(SITE.parents[1])])
            ),
        }

    def shift(self, name: str, delta: timedelta) -> None:
        """Make clock ``name`` jump by ``delta`` (and keep that distance from then on)."""
        with self._lock:
            self._shifts[name] = self._shifts.get(name, timedelta(0)) + delta
        self._write()

    def wait_until(self, moment: datetime, timeout: float | None = None) -> None:
        """Wait until the main clock has passed ``moment``."""
        assert self._origin is not None, "the clock is not running: call run()"
        left = (moment - self.now()).total_seconds() / self.speed
        wait_for(
            lambda: self.now() >= moment,
            timeout=timeout if timeout is not None else max(left, 0) + 5,
            interval=0.01,
            message=f"the fake clock did not reach {moment.isoformat()}",
        )

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)

    def _path(self, name: str) -> Path:
        return self.directory / f"faketime-{name}"

    def _run(self) -> None:
        while not self._stopping.wait(STEP):
            self._write()

    def _write(self) -> None:
        with self._lock:
            names = list(self._shifts)
        with self._writing:
            for name in names:
                self._write_one(name)

    def _write_one(self, name: str) -> None:
        # libfaketime's "+N"/"-N": seconds to add to the real wall clock.
        offset = (self.now(name) - datetime.now(timezone.utc)).total_seconds()
        path = self._path(name)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{offset:+.6f}\n")
        os.replace(tmp, path)  # a reader never sees half a file
