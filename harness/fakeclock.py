"""Real processes on a fake wall clock that runs fast, driven from the test.

Each clock is a small file of numbers, mapped into memory by the test and by
every process on that clock: the fake time at the origin, the monotonic instant
of the origin, the speed, and the clock's own shift. A preloaded shim (C,
compiled once per test run by :mod:`harness.preload`) computes every wall-clock
read from them::

    fake = start + (CLOCK_MONOTONIC - origin) * speed + shift

so time runs ``speed`` times faster than real time from ``start``, smoothly, and
every process on one clock reads the same time as :meth:`FakeClock.now`. The
file changes only when the clock starts running or is shifted; the writer marks
a change in progress with an odd sequence number, and a reader reads again until
it sees the same even one before and after (a seqlock), so a read never mixes
two versions. A reader that cannot map its file aborts rather than read the
real clock.

Why not libfaketime, as before: with ``FAKETIME_NO_CACHE`` it re-reads its
timestamp file on every call through static buffers that all threads share,
without a lock. When two threads read the time at once, one of them now and then
fails to open the file, falls back to ``+0`` and gets the *real* time (a Dramatiq
scheduler, which has threads, once claimed a slot 250 days ahead). Atomic
rewrites of the file do not help: it happens with a file that never changes.
Its own ``x60`` speed-up also divides every ``poll``/``select`` timeout by the
rate and starts each process's clock when that process starts, so replicas
would disagree.

Monotonic time stays real, and so do sleeps and timeouts: leases and their ttl
run on it, as in production, where NTP steps the wall clock but not that.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from .preload import build
from .waiting import wait_for

#: seq (odd while being written), start and origin (ns), speed, shift (ns); x86-64.
_LAYOUT = struct.Struct("<Qqqdq")

_SOURCE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

struct fake_clock {
    uint64_t seq;
    int64_t start_ns;
    int64_t origin_ns;  /* 0: time stands still at start */
    uint64_t speed;     /* a double's bits */
    int64_t shift_ns;
};

static struct fake_clock *mapped;

static struct fake_clock *clock_file(void) {
    struct fake_clock *p = __atomic_load_n(&mapped, __ATOMIC_ACQUIRE);
    if (p) return p;
    const char *path = getenv("FAKE_CLOCK_FILE");
    int fd = path ? (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC) : -1;
    void *m = fd < 0 ? MAP_FAILED : mmap(NULL, sizeof *p, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0) syscall(SYS_close, fd);
    if (m == MAP_FAILED) {
        static const char msg[] = "fakeclock: no FAKE_CLOCK_FILE; not reading the real clock\n";
        syscall(SYS_write, 2, msg, sizeof msg - 1);
        abort();
    }
    /* Two threads may both map it on their first read: both mappings show the same file. */
    __atomic_store_n(&mapped, (struct fake_clock *)m, __ATOMIC_RELEASE);
    return m;
}

static int64_t fake_ns(void) {
    struct fake_clock *p = clock_file();
    int64_t start, origin, shift;
    uint64_t before, after, bits;
    do {
        before = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        start = __atomic_load_n(&p->start_ns, __ATOMIC_RELAXED);
        origin = __atomic_load_n(&p->origin_ns, __ATOMIC_RELAXED);
        bits = __atomic_load_n(&p->speed, __ATOMIC_RELAXED);
        shift = __atomic_load_n(&p->shift_ns, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        after = __atomic_load_n(&p->seq, __ATOMIC_RELAXED);
    } while ((before & 1) || before != after);
    double speed;
    memcpy(&speed, &bits, sizeof speed);
    int64_t elapsed = 0;
    if (origin) {
        struct timespec mono;
        syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &mono);
        elapsed = (int64_t)((mono.tv_sec * 1000000000LL + mono.tv_nsec - origin) * speed);
    }
    return start + elapsed + shift;
}

static void fill(struct timespec *ts) {
    int64_t ns = fake_ns();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE) {
        fill(ts);
        return 0;
    }
    return syscall(SYS_clock_gettime, id, ts);
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    fill(&ts);
    if (tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    fill(&ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


class FakeClock:
    """Fake wall clocks for child processes: one shared time, plus per-clock shifts.

    ``env(name)`` is what a process needs to run on clock ``name``; every clock
    reads :meth:`now` plus its own shift (:meth:`shift`), so ``"main"`` and a
    clock shifted by ten minutes keep their distance as time runs. Time stands
    still at ``start`` until :meth:`run`: processes start up (seconds, on a busy
    machine) without using up fake time.
    """

    def __init__(self, directory: Path, start: datetime, speed: float) -> None:
        self.directory = directory
        self.start = start.astimezone(timezone.utc)
        self.speed = speed
        self._library = build("fakeclock", _SOURCE)
        #: ``CLOCK_MONOTONIC`` (ns) when the clock started running; 0 until :meth:`run`.
        self.origin_ns = 0
        self._shifts: dict[str, timedelta] = {}
        self._maps: dict[str, mmap.mmap] = {}
        self._lock = threading.Lock()
        self._add("main")

    def run(self) -> None:
        """Let time run, ``speed`` times faster than real time."""
        with self._lock:
            self.origin_ns = time.monotonic_ns()
            for name in self._maps:
                self._write(name)

    def now(self, name: str = "main") -> datetime:
        """The fake time of clock ``name`` (aware UTC), as its processes read it."""
        with self._lock:
            origin, shift = self.origin_ns, self._shifts.get(name, timedelta(0))
        elapsed = 0.0 if not origin else (time.monotonic_ns() - origin) * self.speed / 1e9
        return self.start + timedelta(seconds=elapsed) + shift

    def env(self, name: str = "main") -> dict[str, str]:
        """Environment of a Python process on clock ``name`` (created unshifted if new)."""
        self._add(name)
        repo = str(Path(__file__).resolve().parents[1])
        return {
            "LD_PRELOAD": str(self._library),
            "FAKE_CLOCK_FILE": str(self._path(name)),
            # Log lines in UTC: the fake time, readable next to slot names.
            "TZ": "UTC",
            "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), repo])),
        }

    def shift(self, name: str, delta: timedelta) -> None:
        """Make clock ``name`` jump by ``delta`` (and keep that distance from then on)."""
        self._add(name)
        with self._lock:
            self._shifts[name] += delta
            self._write(name)

    def wait_until(self, moment: datetime, timeout: float | None = None) -> None:
        """Wait until the main clock has passed ``moment``."""
        assert self.origin_ns, "the clock is not running: call run()"
        left = (moment - self.now()).total_seconds() / self.speed
        wait_for(
            lambda: self.now() >= moment,
            timeout=timeout if timeout is not None else max(left, 0) + 5,
            interval=0.01,
            message=f"the fake clock did not reach {moment.isoformat()}",
        )

    def close(self) -> None:
        with self._lock:
            for mapped in self._maps.values():
                mapped.close()
            self._maps.clear()

    def _path(self, name: str) -> Path:
        return self.directory / f"fakeclock-{name}"

    def _add(self, name: str) -> None:
        with self._lock:
            if name in self._maps:
                return
            path = self._path(name)
            path.write_bytes(bytes(_LAYOUT.size))
            with path.open("r+b") as file:
                self._maps[name] = mmap.mmap(file.fileno(), _LAYOUT.size)
            self._shifts.setdefault(name, timedelta(0))
            self._write(name)

    def _write(self, name: str) -> None:
        """Rewrite clock ``name``'s fields (holding ``_lock``), marked as a change in
        progress: its sequence number is odd meanwhile, so no reader takes a mix."""
        mapped = self._maps[name]
        (seq, *_) = _LAYOUT.unpack_from(mapped)
        shift = self._shifts[name]
        shift_ns = (shift.days * 86400 + shift.seconds) * 10**9 + shift.microseconds * 1000
        start = self.start
        start_ns = int(start.timestamp()) * 10**9 + start.microsecond * 1000
        # Even to odd changes the lowest byte alone, so a reader never takes a
        # half-written sequence number for the even one it read before.
        struct.pack_into("<Q", mapped, 0, seq + 1)
        struct.pack_into("<qqdq", mapped, 8, start_ns, self.origin_ns, self.speed, shift_ns)
        struct.pack_into("<Q", mapped, 0, seq + 2)
