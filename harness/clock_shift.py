"""A server process whose wall clock is a fixed number of seconds off this host's.

Preloaded, this shim adds ``CLOCK_SHIFT_SECONDS`` to every wall-clock read
(``clock_gettime`` on the realtime clocks, ``gettimeofday``, ``time``) and leaves
the monotonic clocks alone. It has nothing to initialise, so it runs
``redis-server``, which libfaketime 0.9.10 aborts at start-up ("Unexpected
recursive calls to clock_gettime()": jemalloc reads the monotonic clock while
libfaketime is still initialising). It asks the kernel directly, so it never
calls back into a library that might read the time itself. Compiled once per
test run (:mod:`harness.preload`). Scheduler processes on a fake clock that runs
fast use :mod:`harness.fakeclock`.
"""

from __future__ import annotations

import os

from .preload import build

_SOURCE = r"""
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long shift_ns(void) {
    static int loaded;
    static long long ns;
    if (!loaded) {
        const char *text = getenv("CLOCK_SHIFT_SECONDS");
        ns = text ? (long long)(strtod(text, NULL) * 1e9) : 0;
        loaded = 1;
    }
    return ns;
}

static void add(struct timespec *ts) {
    long long total = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns();
    ts->tv_sec = total / 1000000000LL;
    ts->tv_nsec = total % 1000000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = syscall(SYS_clock_gettime, id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) add(ts);
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


def shifted_env(seconds: float) -> dict[str, str]:
    """The environment (this process's, plus the shim) of a server whose wall clock
    runs ``seconds`` ahead of this host's (behind, when negative)."""
    library = build("clockshift", _SOURCE)
    return {**os.environ, "LD_PRELOAD": str(library), "CLOCK_SHIFT_SECONDS": f"{seconds:g}"}
