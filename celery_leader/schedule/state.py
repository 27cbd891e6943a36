"""Slot names (``"<entry>@<ISO due time>"``), the stored run state of a schedule entry
(JSON, never a pickle), and claims of it (a fenced :class:`~celery_leader.backends.Write`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo

from ..backends import Write
from .series import utc


def slot_name(entry: str, due: datetime, zone: tzinfo = timezone.utc) -> str:
    """Name of the slot of ``entry`` due at ``due`` (``"tick@2026-01-01T00:00:00.000+00:00"``),
    in ``zone``'s local time with the offset in force then: the two 02:30s of a fall-back differ.
    """
    return f"{entry}@{utc(due).astimezone(zone).isoformat(timespec='milliseconds')}"


@dataclass(frozen=True)
class RunState:
    """What the store keeps of an entry: the due time of the last slot it recorded."""

    last_run_at: datetime  # aware UTC
    total_run_count: int
    #: The lifetime of the entry's definition this state belongs to (``Job.generation``);
    #: ``None`` in states written before generations existed, or for entries without one.
    generation: str | None = None
    #: The latest ``active_since`` a leader saw of the entry, so that a successor that
    #: never saw the resume or re-timing honours it too.
    active_since: datetime | None = None
    #: Who wrote it (term and instance) and the slot it last sent, where it says.
    epoch: int | None = None
    by: str | None = None
    slot: str | None = None


def dump_state(
    last_run_at: datetime,
    total_run_count: int,
    epoch: int,
    by: str,
    slot: str | None = None,
    generation: str | None = None,
    active_since: datetime | None = None,
) -> str:
    """The shared state of an entry as stored (JSON, read back by :func:`parse_state`);
    ``generation`` and ``active_since`` are written only when the entry has them."""
    state: dict[str, object] = {
        "last_run_at": utc(last_run_at).isoformat(),
        "total_run_count": total_run_count,
        "epoch": epoch,
        "by": by,
    }
    if slot is not None:
        state["slot"] = slot
    if generation is not None:
        state["generation"] = generation
    if active_since is not None:
        state["active_since"] = utc(active_since).isoformat()
    return json.dumps(state)


def parse_state(raw: str) -> RunState | None:
    """The run state in a stored value; ``None`` when unreadable."""
    try:
        data = json.loads(raw)
        last = utc(datetime.fromisoformat(data["last_run_at"]))
        count = data["total_run_count"]
        generation = data.get("generation")
        since = data.get("active_since")
        active_since = None if since is None else utc(datetime.fromisoformat(since))
    except (ValueError, TypeError, KeyError, OverflowError, AttributeError):
        return None
    if not isinstance(count, int) or isinstance(count, bool):
        return None
    if generation is not None and not isinstance(generation, str):
        return None
    epoch, by, slot = data.get("epoch"), data.get("by"), data.get("slot")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not isinstance(by, str):
        epoch, by = None, None
    return RunState(
        last, count, generation, active_since, epoch, by, slot if isinstance(slot, str) else None
    )


def order_key(instant: datetime) -> str:
    """``instant`` (aware) as a key whose string order is time order: fixed-width UTC."""
    at = utc(instant)
    return f"{at.year:04d}-{at:%m-%dT%H:%M:%S.%f}Z"


@dataclass(frozen=True)
class Claim:
    """A fenced change of one schedule entry's stored state: it succeeds only if the term is
    current and the stored state is exactly ``expected`` (``None``: nothing). A claim of a
    slot names its ``due``, which must also be strictly after ``expected``'s ``last_run_at``,
    so a slot is never claimed twice, whatever the clock arithmetic did."""

    entry: str
    expected: str | None
    new: str
    due: datetime | None = None

    def write(self) -> Write:
        """The store's write: the state as opaque text, the slot order as keys it compares."""
        recorded = None if self.expected is None else parse_state(self.expected)
        return Write(
            self.entry,
            self.expected,
            self.new,
            order=None if self.due is None else order_key(self.due),
            after=None if recorded is None else order_key(recorded.last_run_at),
        )

    def admissible(self) -> bool:
        """Whether the claim's slot is after the one its expected state records."""
        return self.write().in_order()
