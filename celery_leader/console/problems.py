"""Each entry's state, from its last record in the run ledger and its options.

The states: ``paused``; ``running`` (a worker runs its last slot), ``overrun``
(for longer than its ``max_runtime`` option); ``failed`` (its last run raised,
or its worker died mid-run); ``late`` (its last slot was sent and has not
started ``late_after`` seconds after it fell due); ``missed`` (the slot after
the last one recorded fell due more than ``late_after`` seconds ago, and the
ledger has no record of it); else ``on time``. Without ``late_after`` an entry
is never late nor missed; without ``max_runtime`` it never overruns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..ledger.summary import EntryRuns
from ..schedule.series import Series

PAUSED, RUNNING, OVERRUN, FAILED, LATE, MISSED, ON_TIME = (
    "paused",
    "running",
    "overrun",
    "failed",
    "late",
    "missed",
    "on time",
)
#: Every state, worst first (the order of the problems page).
STATES = (OVERRUN, FAILED, MISSED, LATE, RUNNING, PAUSED, ON_TIME)
#: The states the entries list's filters select.
FILTERS = {"failing": (FAILED, OVERRUN), "late": (LATE, MISSED), "paused": (PAUSED,)}


@dataclass(frozen=True)
class Limits:
    """An entry's options that the states use (seconds; ``None``: not set)."""

    late_after: float | None = None
    max_runtime: float | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Limits:
        """The limits an entry's options set (a value that is not a number: not set)."""
        return cls(_seconds(options.get("late_after")), _seconds(options.get("max_runtime")))


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)


def state_of(
    enabled: bool,
    series: Series | None,
    runs: EntryRuns | None,
    limits: Limits,
    now: float,
) -> str:
    """The state of one entry (see the module docstring)."""
    if not enabled:
        return PAUSED
    if runs is None:
        return ON_TIME
    if runs.state == "running":
        started = runs.started
        if limits.max_runtime is not None and started is not None:
            return OVERRUN if now - started > limits.max_runtime else RUNNING
        return RUNNING
    if runs.state == "abandoned" or runs.outcome == "failure":
        return FAILED
    due = slot_due(runs.last_slot)
    if limits.late_after is None or due is None:
        return ON_TIME
    if runs.state == "sent" and now - due.timestamp() > limits.late_after:
        return LATE
    following = None if series is None else series.next_after(due)
    if following is not None and now - following.timestamp() > limits.late_after:
        return MISSED
    return ON_TIME


def slot_due(slot: str) -> datetime | None:
    """The due instant a slot name ends in (``"<entry>@<ISO time>"``); ``None`` for a
    run outside the grid (``@run:...``) or a key that names none."""
    try:
        due = datetime.fromisoformat(slot.rpartition("@")[2])
    except ValueError:
        return None
    return due if due.tzinfo is not None else due.replace(tzinfo=timezone.utc)
