"""Imported at start-up by Python processes that run under libfaketime (see harness/fakeclock.py).

libfaketime 0.9.10 (Debian 12) fails ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``
with EINVAL when ``FAKETIME_DONT_FAKE_MONOTONIC`` is set, and that is exactly how
Python 3.11's ``time.sleep`` sleeps. A timed lock acquire waits on the real
monotonic clock too (``sem_clockwait``), which libfaketime leaves alone, and is
interrupted by signals as ``time.sleep`` is.
"""

import threading
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    lock = threading.Lock()
    lock.acquire()
    lock.acquire(timeout=seconds)


time.sleep = _sleep
