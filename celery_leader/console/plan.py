"""The plan: the slots due in a window across all entries, as ``leader plan`` lists
them, with the busiest seconds marked."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

from ..schedule import plan as planning
from ..schedule.catalog import policy
from ..schedule.jobs import Job
from .reads import Reads

#: The plan's default window, from now.
PLAN_WINDOW = timedelta(hours=1)
#: The busiest seconds a plan marks.
BUSIEST = 5


def jobs(reads: Reads) -> list[Job]:
    """Every enabled entry as a job of the plan (anchored where the plan starts, so
    the missed-slot policy does not apply)."""
    index = reads.index()
    out = []
    for name in index.names:
        found = index.get(name)
        if found is None or not found.enabled:
            continue
        stored = found.stored if found.source == "store" else None
        missed, grace = policy(
            reads.config,
            None if stored is None else stored.missed_slots,
            None if stored is None else stored.missed_slots_grace,
        )
        out.append(Job(name, found.series, missed, grace, index.zone))
    return out


def plan(reads: Reads, start: str = "now", end: str = "", tz: str = "") -> dict[str, Any]:
    """The slots due between ``start`` and ``end`` (default: the next hour) across all
    entries, as ``leader plan`` lists them, with the busiest seconds marked."""
    zone = planning.parse_zone(tz) if tz else timezone.utc
    now = datetime.now(timezone.utc)
    begin = planning.parse_moment(start or "now", zone, now)
    until = planning.parse_moment(end, zone, now) if end else begin + PLAN_WINDOW
    result = planning.plan(jobs(reads), begin, until)
    data = planning.to_json(result, zone)
    per_second = Counter(s.due.replace(microsecond=0) for s in result.slots)
    busiest = [(at.isoformat(), n) for at, n in per_second.most_common(BUSIEST) if n > 1]
    marked = {at for at, _ in busiest}
    for slot in data["slots"]:
        slot["busy"] = slot["due"][:19] + "+00:00" in marked
    data["busiest"] = [{"second": at, "slots": n} for at, n in busiest]
    data["total"] = len(data["slots"])
    return data
