"""``cron()`` and ``every()``: when a Dramatiq actor's slots fall due (never on the host's
zone: ``every`` aligns to multiples of its period since the epoch, ``cron`` reads ``tz``)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..exceptions import ConfigError, missing_extra
from ..schedule.series import Every, Series
from ..settings.config import validate_grace, validate_missed_slots, validate_name

try:
    from cronsim import CronSim, CronSimError
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "dramatiq") from None


class Schedule(Series, ABC):
    """When an actor runs, with which arguments and slot name, and what to do with
    missed slots (``missed_slots`` and ``missed_slots_grace``, else the settings)."""

    def __init__(
        self,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        missed_slots: str | None = None,
        missed_slots_grace: float | None = None,
    ) -> None:
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.name = None if name is None else validate_name("name", name)
        self.missed_slots = (
            None if missed_slots is None else validate_missed_slots("missed_slots", missed_slots)
        )
        self.missed_slots_grace = validate_grace("missed_slots_grace", missed_slots_grace)

    @abstractmethod
    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after ``moment`` (aware UTC)."""


class every(Schedule):  # lower case, like a function, as in the contract
    """Every ``seconds`` (fractions allowed), at multiples of the period since the epoch."""

    def __init__(
        self,
        seconds: float,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        missed_slots: str | None = None,
        missed_slots_grace: float | None = None,
    ) -> None:
        super().__init__(args, kwargs, name, missed_slots, missed_slots_grace)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ConfigError(f"every() needs a number of seconds (got {seconds!r})")
        if not math.isfinite(seconds) or seconds < 0.001:
            raise ConfigError(f"every() needs at least 0.001 seconds (got {seconds!r})")
        self.seconds = float(seconds)
        # Whole microseconds, so that slot times are exact and agree on every host.
        self._grid = Every(timedelta(microseconds=round(seconds * 1_000_000)))

    def next_after(self, moment: datetime) -> datetime:
        return self._grid.next_after(moment)

    def anchor(self, now: datetime) -> datetime:
        return self._grid.anchor(now)

    def walk(self, after: datetime, until: datetime, keep: int) -> tuple[list[datetime], int]:
        return self._grid.walk(after, until, keep)

    def spacing(self) -> float:
        return self.seconds

    def key(self) -> tuple[object, ...]:
        return self._grid.key()

    def __repr__(self) -> str:
        return f"every({self.seconds:g}{_extra(self)})"


class cron(Schedule):  # lower case, like a function, as in the contract
    """A cron expression read in ``tz`` (default UTC), computed by cronsim: a 02:30 job runs
    once when the clock goes back and at 03:00 when it jumps forward, as in cron."""

    def __init__(
        self,
        expression: str,
        *,
        tz: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        missed_slots: str | None = None,
        missed_slots_grace: float | None = None,
    ) -> None:
        super().__init__(args, kwargs, name, missed_slots, missed_slots_grace)
        try:
            self.tz = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigError(f"cron() tz must be an IANA time zone name (got {tz!r})") from None
        try:
            next(CronSim(expression, datetime.now(self.tz)))
        except (CronSimError, StopIteration, TypeError) as exc:
            raise ConfigError(f"cron() expression {expression!r} is invalid: {exc}") from None
        self.expression = expression

    def next_after(self, moment: datetime) -> datetime:
        start = moment.astimezone(self.tz)
        for candidate in CronSim(self.expression, start):
            # cronsim walks local wall time; across a clock change a candidate may
            # map to an instant that is not after ``moment``.
            due = candidate.astimezone(timezone.utc)
            if due > moment:
                return due
        raise ConfigError(f"cron() expression {self.expression!r} has no further slot")

    def key(self) -> tuple[object, ...]:
        return ("cronsim", self.expression, self.tz.key)

    def __repr__(self) -> str:
        return f"cron({self.expression!r}, tz={self.tz.key!r}{_extra(self)})"


def _extra(schedule: Schedule) -> str:
    extra = "" if schedule.name is None else f", name={schedule.name!r}"
    if schedule.missed_slots is not None:
        extra += f", missed_slots={schedule.missed_slots!r}"
    if schedule.missed_slots_grace is not None:
        extra += f", missed_slots_grace={schedule.missed_slots_grace:g}"
    return extra
