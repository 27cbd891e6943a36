"""``leader plan``: the slots a leader would send in a window, without sending any.

A dry run with the scheduler's own arithmetic and no I/O: a leader promoted at
``start`` that leads until ``end`` and ticks at every due instant. Each entry starts
anchored at ``start`` (as a new one), or from its stored ``last_run_at`` (missed
slots then go through its missed-slot policy at ``start``; state further ahead than
:data:`~celery_leader.schedule.sync.REPAIR_AFTER` is re-anchored, as a promotion would).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .jobs import Job
from .policy import counted_after, due_slots
from .series import utc
from .state import parse_state, slot_name
from .sync import REPAIR_AFTER

#: The longest window planned: a year (and a leap day).
MAX_WINDOW = timedelta(days=366)
#: The most slots a plan lists: a window that holds more is refused, not truncated.
MAX_SLOTS = 100_000


class PlanError(ValueError):
    """Bad input of a plan (a window, a time, a zone): ``str(self)`` is the line to print."""


@dataclass(frozen=True)
class PlannedSlot:
    """One slot the leader would send."""

    entry: str
    due: datetime  # aware UTC
    slot: str  # its ``leader_slot``, exactly as sent
    sent_at: datetime  # ``due``, or the window's start for a missed slot sent late


@dataclass(frozen=True)
class Plan:
    """The slots of a window, in the order they would be sent."""

    start: datetime
    end: datetime
    slots: list[PlannedSlot]
    #: Missed slots (stored state only) that the policy does not send, per entry.
    dropped: dict[str, int] = field(default_factory=dict)
    #: Entries whose due times only their framework can tell (Celery's solar and
    #: custom schedules, ``leader_crontab_dst = "celery"``): not planned.
    unplanned: list[str] = field(default_factory=list)


def plan(
    jobs: Sequence[Job],
    start: datetime,
    end: datetime,
    last_runs: Mapping[str, datetime] | None = None,
) -> Plan:
    """The slots ``jobs`` would send in ``(start, end]`` (see the module's docstring);
    ``last_runs``: stored ``last_run_at`` by name (a missing one anchors at ``start``)."""
    start, end = utc(start), utc(end)
    if end < start:
        raise PlanError(
            f"the window ends ({end.isoformat()}) before it starts ({start.isoformat()})"
        )
    if end - start > MAX_WINDOW:
        raise PlanError(f"the window is longer than {MAX_WINDOW.days} days: plan a shorter one")
    slots: list[PlannedSlot] = []
    dropped: dict[str, int] = {}
    unplanned: list[str] = []
    for job in jobs:
        series = job.series
        if series is None:
            unplanned.append(job.name)
            continue
        last = _state_at(series.anchor(start), (last_runs or {}).get(job.name), start)
        last = counted_after(last, job.active_since)  # nothing from before it was active
        # The promotion at ``start``: what the policy sends of the missed slots.
        found = due_slots(series, last, start, start, job.missed_slots, job.grace)
        if found is not None:
            slots.extend(
                PlannedSlot(job.name, due, slot_name(job.name, due, job.zone), start)
                for due in found.send
            )
            if found.dropped:
                dropped[job.name] = found.dropped
            last = found.record
        # Then every slot on time, each planned as the leader's tick at its due instant.
        while len(slots) <= MAX_SLOTS:
            due = series.next_after(last)
            if due is None or due > end:
                break
            step = due_slots(series, last, due, start, job.missed_slots, job.grace)
            assert step is not None  # ``due`` itself is due
            slots.extend(
                PlannedSlot(job.name, sent, slot_name(job.name, sent, job.zone), sent)
                for sent in step.send
            )
            last = step.record
        if len(slots) > MAX_SLOTS:
            raise PlanError(f"the window holds more than {MAX_SLOTS} slots: plan a shorter one")
    slots.sort(key=lambda s: (s.sent_at, s.due, s.entry))
    return Plan(start, end, slots, dropped, unplanned)


def _state_at(anchor: datetime, stored: datetime | None, start: datetime) -> datetime:
    """The ``last_run_at`` a leader promoted at ``start`` works from (sync's rules)."""
    if stored is None or stored - start > REPAIR_AFTER:
        return anchor
    return stored


def stored_last_runs(stored: Mapping[str, str], jobs: Sequence[Job]) -> dict[str, datetime]:
    """Each entry's ``last_run_at`` in ``stored`` (the beat election's state) as the leader
    counts it, from its ``active_since``; unreadable and other generations' left out."""
    generations = {job.name: job.generation for job in jobs}
    runs = {}
    for name, value in stored.items():
        state = parse_state(value)
        if state is None:
            continue
        if state.generation is not None and state.generation != generations.get(name):
            continue
        runs[name] = counted_after(state.last_run_at, state.active_since)
    return runs


def parse_zone(name: str) -> tzinfo:
    """The IANA zone ``name``; :class:`PlanError` when there is none."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise PlanError(f"unknown time zone {name!r} (an IANA name, e.g. Europe/Berlin)") from None


def parse_moment(text: str, zone: tzinfo, now: datetime) -> datetime:
    """``--from``/``--to``: ISO 8601 (``Z`` allowed), or ``now``; aware UTC. A time without
    an offset is read in ``zone``; one its clock skips or repeats is refused."""
    if text.strip().lower() == "now":
        return utc(now)
    raw = text.strip()
    try:
        moment = datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw)
    except ValueError:
        raise PlanError(
            f"cannot read time {text!r}: use ISO 8601, e.g. 2026-10-25T02:30:00+01:00, or 'now'"
        ) from None
    if moment.tzinfo is not None:
        return utc(moment)
    first = utc(moment.replace(tzinfo=zone, fold=0))
    second = utc(moment.replace(tzinfo=zone, fold=1))
    if first != second:
        gap = first.astimezone(zone).replace(tzinfo=None) != moment
        what = "does not exist" if gap else "happens twice"
        raise PlanError(
            f"time {text!r} {what} in {zone} (a clock change): give its UTC offset, "
            f"e.g. {moment.isoformat()}+01:00"
        )
    return first


def to_json(result: Plan, zone: tzinfo) -> dict[str, Any]:
    """The plan as JSON-ready data; local times in ``zone``."""
    return {
        "from": result.start.isoformat(),
        "to": result.end.isoformat(),
        "tz": str(zone),
        "slots": [
            {
                "entry": s.entry,
                "due": s.due.isoformat(timespec="milliseconds"),
                "local": s.due.astimezone(zone).isoformat(timespec="milliseconds"),
                "slot": s.slot,
                "late": s.sent_at != s.due,
            }
            for s in result.slots
        ],
        "dropped": result.dropped,
        "unplanned": result.unplanned,
    }


def to_lines(result: Plan, zone: tzinfo) -> list[str]:
    """The plan as a table for people; local times in ``zone``."""
    width = max([len(s.entry) for s in result.slots] + [5])
    lines = [
        f"{len(result.slots)} slot(s) due after {result.start.isoformat()} up to "
        f"{result.end.isoformat()}; local time in {zone}",
        f"{'DUE (UTC)':<23}  {'LOCAL':<29}  {'ENTRY':<{width}}  SLOT",
    ]
    for s in result.slots:
        local = s.due.astimezone(zone)
        lines.append(
            f"{s.due.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}  "
            f"{local.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]} {local.tzname() or '':<5}  "
            f"{s.entry:<{width}}  {s.slot}"
            + ("  (missed: sent late, at the start)" if s.sent_at != s.due else "")
        )
    for name, count in result.dropped.items():
        lines.append(f"{name}: {count} missed slot(s) not sent (leader_missed_slots)")
    for name in result.unplanned:
        lines.append(f"{name}: not planned (only its framework can tell when it is due)")
    return lines
