"""An entry's schedule as people read it: in words, its zone, its next fire times in
that zone and in UTC, and a flag on a slot that a clock change moves or repeats.

The instants come from the scheduler's own :class:`~celery_leader.schedule.series.Series`
(so what the page shows is what the leader sends); only the words are made here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..schedule.entries import Bounded, Once
from ..schedule.series import CronSeries, Every, Series, utc

_DAY_NAMES = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat")
_UNITS = ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))

#: A slot moved to the jump of a spring-forward night (its wall time does not exist).
MOVED = "moved: its time is skipped by a clock change"
#: A slot in the hour a fall-back night repeats.
REPEATED = "in a repeated hour (clock change)"
#: The first slot after the zone's offset changed.
AFTER_CHANGE = "first slot after a clock change"


@dataclass(frozen=True)
class Fire:
    """One coming slot of an entry."""

    utc: datetime
    local: datetime  # in the entry's zone
    #: Why a clock change concerns this slot (``MOVED``, ``REPEATED``,
    #: ``AFTER_CHANGE``), or ``None``.
    dst: str | None

    def to_json(self) -> dict[str, Any]:
        """The slot as JSON: ISO times, and the flag."""
        return {
            "utc": self.utc.isoformat(timespec="seconds"),
            "local": self.local.isoformat(timespec="seconds"),
            "dst": self.dst,
        }


def zone_named(name: str | None) -> tzinfo:
    """The zone ``name`` (UTC when unknown or not given)."""
    if not name:
        return timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return timezone.utc


def zone_of(series: Series | None, default: tzinfo) -> tzinfo:
    """The zone an entry's slots are read in: its crontab's, else ``default``."""
    inner = series.inner if isinstance(series, Bounded) else series
    return inner.zone if isinstance(inner, CronSeries) else default


def next_fires(series: Series | None, zone: tzinfo, now: datetime, count: int = 3) -> list[Fire]:
    """The next ``count`` slots of ``series`` after ``now``, each flagged as a clock
    change concerns it (see :data:`MOVED`, :data:`REPEATED`, :data:`AFTER_CHANGE`)."""
    fires: list[Fire] = []
    if series is None:
        return fires
    cron = _cron(series)
    moment = utc(now)
    offset = moment.astimezone(zone).utcoffset()
    for _ in range(count):
        due = series.next_after(moment)
        if due is None:
            break
        local = due.astimezone(zone)
        fires.append(Fire(due, local, _flag(local, zone, cron, offset)))
        moment, offset = due, local.utcoffset()
    return fires


def _flag(
    local: datetime, zone: tzinfo, cron: CronSeries | None, before: timedelta | None
) -> str | None:
    wall = local.replace(tzinfo=None)
    if cron is not None and (local.hour not in cron.hours or local.minute not in cron.minutes):
        return MOVED
    other = utc(wall.replace(tzinfo=zone, fold=1 - local.fold))
    if other != utc(local) and other.astimezone(zone).replace(tzinfo=None) == wall:
        return REPEATED
    return AFTER_CHANGE if before is not None and local.utcoffset() != before else None


def _cron(series: Series) -> CronSeries | None:
    inner = series.inner if isinstance(series, Bounded) else series
    return inner if isinstance(inner, CronSeries) else None


def in_words(series: Series | None) -> str:
    """The schedule of ``series`` in words: ``every 5 minutes``, ``daily at 02:30``."""
    if series is None:
        return "only its framework can tell"
    if isinstance(series, Bounded):
        bounds = []
        if series.start is not None:
            bounds.append(f"from {utc(series.start).isoformat(timespec='seconds')}")
        if series.end is not None:
            bounds.append(f"until {utc(series.end).isoformat(timespec='seconds')}")
        return f"{in_words(series.inner)} ({' '.join(bounds)})"
    if isinstance(series, Every):
        return _every(series.period.total_seconds())
    if isinstance(series, Once):
        return f"once, at {series.at.isoformat(timespec='seconds')}"
    if isinstance(series, CronSeries):
        return _cron_words(series)
    return repr(series)


def _every(seconds: float) -> str:
    for size, unit in _UNITS:
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"every {unit}" if count == 1 else f"every {count} {unit}s"
    return f"every {seconds:g} seconds"


def _cron_words(cron: CronSeries) -> str:
    minutes, hours = cron.minutes, cron.hours
    days = _days(cron)
    if len(hours) == 24 and len(minutes) == 60:
        when = "every minute"
    elif len(hours) == 24:
        step = _step(minutes, 60)
        when = (
            f"every {step} minutes"
            if step
            else f"every hour at minute {', '.join(str(m) for m in minutes)}"
        )
    elif len(hours) * len(minutes) <= 4:
        when = "at " + ", ".join(f"{h:02d}:{m:02d}" for h in hours for m in minutes)
    else:
        return f"{len(hours) * len(minutes)} times a day{days} ({cron.zone})"
    return f"{when}{days} ({cron.zone})"


def _days(cron: CronSeries) -> str:
    every_weekday = len(cron.days_of_week) == 7
    every_day = len(cron.days_of_month) == 31 and len(cron.months) == 12
    if every_weekday and every_day:
        return ", daily" if len(cron.hours) < 24 else ""
    parts = []
    if not every_weekday:
        parts.append("on " + ", ".join(_DAY_NAMES[d] for d in sorted(cron.days_of_week)))
    if len(cron.days_of_month) != 31:
        parts.append("on day " + ", ".join(str(d) for d in sorted(cron.days_of_month)))
    if len(cron.months) != 12:
        parts.append("in month " + ", ".join(str(m) for m in sorted(cron.months)))
    return ", " + " ".join(parts)


def _step(values: list[int], size: int) -> int | None:
    """The step of ``values`` if they are ``0, n, 2n, ...`` over the field, else ``None``."""
    if len(values) < 2 or values[0] != 0:
        return None
    step = values[1]
    return step if values == list(range(0, size, step)) else None
