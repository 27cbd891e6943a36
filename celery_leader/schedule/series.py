"""When an entry's slots fall due: series of UTC instants, never wall-clock arithmetic.

Python's arithmetic on zone-aware datetimes ignores ``fold`` (inside a repeated
hour ``now + 1 s`` can be an hour *earlier*), so no zone-aware value is added to
or compared here: local time only evaluates a crontab's fields and names a slot.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from datetime import date, datetime, time, timedelta, timezone, tzinfo

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
_DAY = timedelta(days=1)
#: More than any clock change of any zone moves wall time.
_SLACK = timedelta(hours=3)

#: Days a crontab is searched ahead for its next slot: four years and a day (a Feb 29th
#: on a given weekday may take 28 years; "no slot in four years" is a fair answer).
_CRON_HORIZON_DAYS = 4 * 366 + 1


def utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime (a naive one is taken as UTC)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


class Series(ABC):
    """The due instants of one schedule entry, in UTC."""

    @abstractmethod
    def next_after(self, moment: datetime) -> datetime | None:
        """The first due instant strictly after ``moment`` (aware UTC), or ``None``."""

    def key(self) -> tuple[object, ...]:
        """What the series is, by value: two series with equal keys fall due alike (the
        protocol tells a changed schedule by it). By default a series is only itself."""
        return ("object", id(self))

    def __eq__(self, other: object) -> bool:
        # By value: a job rebuilt from an equal schedule then equals the one the
        # protocol holds, which keeps its next due time instead of recomputing it.
        return isinstance(other, Series) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def anchor(self, now: datetime) -> datetime:
        """Where an entry with no stored state starts: its next slot is the first after this."""
        return now

    def spacing(self) -> float:
        """Roughly the seconds between two slots: a new leader loads the most frequent first."""
        return 60.0

    def walk(self, after: datetime, until: datetime, keep: int) -> tuple[list[datetime], int]:
        """Due instants in ``(after, until]``: the newest ``keep`` of them and how many there are
        (walked back from ``until`` over a growing window, so the count may be a lower bound;
        :class:`Every` counts exactly)."""
        window = timedelta(hours=1)
        while True:
            begin = max(after, until - window)
            found: list[datetime] = []
            moment = begin
            for _ in range(_MAX_STEPS):
                due = self.next_after(moment)
                if due is None or due > until:
                    break
                found.append(due)
                moment = due
            if begin == after or len(found) >= keep:
                return found[-keep:] if keep else [], len(found)
            window *= 24


#: A walk stops after this many slots (a minutely entry down for a week).
_MAX_STEPS = 10_080


class Every(Series):
    """Every ``period``, at whole multiples of it since the Unix epoch (elapsed time, not
    wall time): entries sharing a period share their slots, so a batch stays one claim."""

    def __init__(self, period: timedelta) -> None:
        if period <= timedelta(0):
            raise ValueError(f"a period must be positive (got {period})")
        self.period = period
        # Whole microseconds, so that due times are exact and agree on every host.
        self._period_us = period // _MICROSECOND

    def _index(self, moment: datetime) -> int:
        """How many whole periods lie between the epoch and ``moment``."""
        return ((utc(moment) - EPOCH) // _MICROSECOND) // self._period_us

    def next_after(self, moment: datetime) -> datetime:
        return EPOCH + (self._index(moment) + 1) * self._period_us * _MICROSECOND

    def anchor(self, now: datetime) -> datetime:
        """The latest slot at or before ``now``: the next one is the first slot after it."""
        return EPOCH + self._index(now) * self._period_us * _MICROSECOND

    def walk(self, after: datetime, until: datetime, keep: int) -> tuple[list[datetime], int]:
        first, last = self._index(after) + 1, self._index(until)
        if last < first:
            return [], 0
        start = max(first, last - keep + 1)
        dues = [EPOCH + i * self._period_us * _MICROSECOND for i in range(start, last + 1)]
        return dues, last - first + 1

    def spacing(self) -> float:
        return self._period_us / 1_000_000

    def key(self) -> tuple[object, ...]:
        return ("every", self._period_us)

    def __repr__(self) -> str:
        return f"Every({self.period.total_seconds():g} s)"


class CronSeries(Series):
    """A crontab's fields read in ``zone``, with the clock-change rules of cron.

    A day matches when its month, day of month *and* day of week match (Celery's
    rule). In a repeated (fall-back) hour an every-hour entry fires in both hours, a
    fixed-hour one (02:30) once, at the first; in a skipped (spring-forward) hour an
    every-hour entry has nothing to fire, a fixed-hour one fires once at the jump.
    """

    def __init__(
        self,
        zone: tzinfo,
        minutes: Collection[int],
        hours: Collection[int],
        days_of_month: Collection[int],
        months: Collection[int],
        days_of_week: Collection[int],
    ) -> None:
        self.zone = zone
        self.minutes = sorted(set(minutes))
        self.hours = sorted(set(hours))
        self.days_of_month = frozenset(days_of_month)
        self.months = frozenset(months)
        # 0 = Sunday, as in cron and Celery; Python's isoweekday() % 7 matches.
        self.days_of_week = frozenset(d % 7 for d in days_of_week)
        fields = (self.minutes, self.hours, self.days_of_month, self.months, self.days_of_week)
        if not all(fields):
            raise ValueError("a crontab needs at least one value in every field")
        #: Every hour of the day: runs on elapsed time across clock changes.
        self.every_hour = len(self.hours) == 24
        #: The last question and its answer: a new term settles thousands of entries of
        #: one expression at one instant, and a third of its time went to asking again.
        self._last: tuple[datetime, datetime | None] | None = None

    def _day_matches(self, day: date) -> bool:
        return (
            day.month in self.months
            and day.day in self.days_of_month
            and day.isoweekday() % 7 in self.days_of_week
        )

    def _resolve(self, wall: datetime) -> list[datetime]:
        """UTC instants at which the naive local time ``wall`` fires."""
        first = wall.replace(tzinfo=self.zone, fold=0)
        second = wall.replace(tzinfo=self.zone, fold=1)
        a, b = utc(first), utc(second)
        if a == b:
            return [a]
        # A wall time that round-trips exists; one that does not fell into a gap.
        exists_first = utc(a).astimezone(self.zone).replace(tzinfo=None) == wall
        exists_second = utc(b).astimezone(self.zone).replace(tzinfo=None) == wall
        if exists_first and exists_second:  # the repeated hour of a fall-back
            return sorted({a, b}) if self.every_hour else [min(a, b)]
        if self.every_hour:
            return []  # the hour that did not happen: nothing elapsed to fire for
        return [self._jump(wall)]

    def _jump(self, wall: datetime) -> datetime:
        """The instant the clock jumped over ``wall``: the first wall time after it that exists."""
        later = wall
        for _ in range(24 * 60):
            later += timedelta(minutes=1)
            moment = utc(later.replace(tzinfo=self.zone))
            if moment.astimezone(self.zone).replace(tzinfo=None) == later:
                return moment  # the first wall time after the gap: the jump itself
        raise ValueError(f"no wall time after {wall} exists in {self.zone}")

    def next_after(self, moment: datetime) -> datetime | None:
        last = self._last
        if last is not None and last[0] == moment:
            return last[1]
        due = self._next_after(moment)
        self._last = (moment, due)
        return due

    def _next_after(self, moment: datetime) -> datetime | None:
        moment = utc(moment)
        # Wall times are walked in order. Near a clock change, a wall time up to
        # the size of the change (an hour; two at most in any zone's history)
        # before the local time of ``moment`` can still fall after it, and one
        # that much after the best found can fall before it: _SLACK covers both.
        local = moment.astimezone(self.zone)
        near = (moment - _SLACK).astimezone(self.zone).utcoffset() != (
            (moment + _SLACK).astimezone(self.zone).utcoffset()
        )
        slack = _SLACK if near else timedelta(0)  # no change near: wall time is monotonic
        floor = local.replace(tzinfo=None) - slack
        day = floor.date()
        for _ in range(_CRON_HORIZON_DAYS):
            if self._day_matches(day):
                best: datetime | None = None
                stop_at: datetime | None = None
                for hour in self.hours:
                    for minute in self.minutes:
                        wall = datetime.combine(day, time(hour, minute))
                        if wall < floor:
                            continue
                        if stop_at is not None and wall > stop_at:
                            return best
                        for due in self._resolve(wall):
                            if due > moment and (best is None or due < best):
                                best, stop_at = due, wall + slack
                if best is not None:
                    return best
            day += _DAY
        return None

    def key(self) -> tuple[object, ...]:
        # The zone by name: equal zones may be distinct objects (a cache miss, pytz).
        return (
            "cron",
            str(self.zone),
            tuple(self.minutes),
            tuple(self.hours),
            tuple(sorted(self.days_of_month)),
            tuple(sorted(self.months)),
            tuple(sorted(self.days_of_week)),
        )

    def __repr__(self) -> str:
        return f"CronSeries({self.zone}, minutes={self.minutes}, hours={self.hours})"
