"""Polling with a deadline, so tests wait for a condition instead of sleeping and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    interval: float = 0.01,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Call ``predicate`` until it returns something truthy and return that value.

    Raises AssertionError after ``timeout`` seconds. ``message`` may be a callable so
    that the failure can describe the state at the moment it gave up (a log tail, say).
    """
    start = time.monotonic()
    deadline = start + timeout
    while True:
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(
                f"{text}: not true after {now - start:.2f}s (timeout {timeout}s); "
                f"last value {value!r}"
            )
        time.sleep(min(interval, deadline - now))
