"""Slot names and the stored run state of a schedule entry, shared by beat and Dramatiq.

Pure functions, no task queue: a slot is named ``"<entry>@<ISO due time>"`` and an
entry's state is stored as JSON (never a pickle) that both schedulers read back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo

from .series import utc


def slot_name(entry: str, due: datetime, zone: tzinfo = timezone.utc) -> str:
    """Name of the slot of ``entry`` due at ``due``, in ``zone``'s local time with its offset.

    ``"tick@2026-01-01T00:00:00.000+00:00"``. The offset is the one in force at that
    instant, so the two 02:30s of a fall-back day get different names.
    """
    return f"{entry}@{utc(due).astimezone(zone).isoformat(timespec='milliseconds')}"


@dataclass(frozen=True)
class RunState:
    """What the store keeps of an entry: the due time of the last slot it recorded."""

    last_run_at: datetime  # aware UTC
    total_run_count: int


def dump_state(
    last_run_at: datetime, total_run_count: int, epoch: int, by: str, slot: str | None = None
) -> str:
    """The shared state of an entry as stored: JSON, read back by :func:`parse_state`.

    ``last_run_at`` is kept in UTC; ``slot``, ``epoch`` and ``by`` are for people
    reading the store.
    """
    state: dict[str, object] = {
        "last_run_at": utc(last_run_at).isoformat(),
        "total_run_count": total_run_count,
        "epoch": epoch,
        "by": by,
    }
    if slot is not None:
        state["slot"] = slot
    return json.dumps(state)


def parse_state(raw: str) -> RunState | None:
    """The run state in a stored value; ``None`` when unreadable."""
    try:
        data = json.loads(raw)
        last = utc(datetime.fromisoformat(data["last_run_at"]))
        count = data["total_run_count"]
    except (ValueError, TypeError, KeyError, OverflowError):
        return None
    if not isinstance(count, int) or isinstance(count, bool):
        return None
    return RunState(last, count)
