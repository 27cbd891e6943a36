"""Slot names and the stored run state of a schedule entry, shared by beat and Dramatiq.

Pure functions, no task queue: a slot is named ``"<entry>@<ISO due time>"`` and an
entry's state is stored as JSON (never a pickle) that both schedulers read back.
"""

from __future__ import annotations

import json
from datetime import datetime


def slot_name(entry: str, due: datetime) -> str:
    """Name of the slot of ``entry`` due at ``due``: ``"tick@2026-01-01T00:00:00.000+00:00"``."""
    return f"{entry}@{due.isoformat(timespec='milliseconds')}"


def dump_state(
    last_run_at: datetime, total_run_count: int, epoch: int, by: str, slot: str | None = None
) -> str:
    """The shared state of an entry as stored: JSON, read back by :func:`parse_state`.

    ``slot``, ``epoch`` and ``by`` are for people reading the store; only
    ``last_run_at`` and ``total_run_count`` are read back.
    """
    state: dict[str, object] = {
        "last_run_at": last_run_at.isoformat(),
        "total_run_count": total_run_count,
        "epoch": epoch,
        "by": by,
    }
    if slot is not None:
        state["slot"] = slot
    return json.dumps(state)


def parse_state(raw: str) -> tuple[datetime, int] | None:
    """``(last_run_at, total_run_count)`` of a stored state; ``None`` when unreadable."""
    try:
        data = json.loads(raw)
        last = datetime.fromisoformat(data["last_run_at"])
        count = data["total_run_count"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(count, int):
        return None
    return last, count
