"""The plan: the first slots due in a window across all entries, as ``leader plan``
lists them, with the busiest seconds marked (from the due-time index of
:mod:`.upcoming`: a plan costs the slots it lists)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

from ..schedule import plan as planning
from ..schedule.state import slot_name
from .reads import Reads
from .upcoming import due_times

#: The plan's default window, from now.
PLAN_WINDOW = timedelta(hours=1)
#: The busiest seconds a plan marks.
BUSIEST = 5
#: The most slots a plan lists: the earliest of its window.
ROWS = 1000


def plan(reads: Reads, start: str = "now", end: str = "", tz: str = "") -> dict[str, Any]:
    """The first :data:`ROWS` slots due between ``start`` and ``end`` (default: the next
    hour) across all entries, as ``leader plan`` lists them, with the busiest seconds
    among them marked; ``more``: the window holds others."""
    zone = planning.parse_zone(tz) if tz else timezone.utc
    now = datetime.now(timezone.utc)
    begin = planning.parse_moment(start or "now", zone, now)
    until = planning.parse_moment(end, zone, now) if end else begin + PLAN_WINDOW
    if until < begin:
        raise planning.PlanError(
            f"the window ends ({until.isoformat()}) before it starts ({begin.isoformat()})"
        )
    if until - begin > planning.MAX_WINDOW:
        raise planning.PlanError(
            f"the window is longer than {planning.MAX_WINDOW.days} days: plan a shorter one"
        )
    index = reads.index()
    window = due_times(index).window(begin, until, ROWS)
    per_second = Counter(s.due.replace(microsecond=0) for s in window.slots)
    busiest = [(at, n) for at, n in per_second.most_common(BUSIEST) if n > 1]
    marked = {at for at, _ in busiest}
    slots = [
        {
            "entry": s.entry,
            "due": s.due.isoformat(timespec="milliseconds"),
            "local": s.due.astimezone(zone).isoformat(timespec="milliseconds"),
            "slot": slot_name(s.entry, s.due, index.zone),
            "busy": s.due.replace(microsecond=0) in marked,
        }
        for s in window.slots
    ]
    return {
        "from": begin.isoformat(),
        "to": until.isoformat(),
        "tz": str(zone),
        "slots": slots,
        "total": len(slots),
        "more": window.more,
        "busiest": [{"second": at.isoformat(), "slots": n} for at, n in busiest],
        "unplanned": window.unplanned,
    }
