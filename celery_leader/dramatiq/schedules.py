"""``cron()`` and ``every()``: when a Dramatiq actor's slots fall due.

A schedule only computes times, always as aware UTC datetimes; which slot is
sent, and by whom, is the scheduler's business. Slot times never depend on the
host's clock zone: ``every`` aligns its slots to multiples of its period since
the Unix epoch, and ``cron`` reads its fields in ``tz`` (UTC by default).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..config import validate_name
from ..exceptions import ConfigError, missing_extra

try:
    from cronsim import CronSim, CronSimError
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "dramatiq") from None

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: A missed-slot catch-up walks at most this many cron slots (beyond it the
#: entry restarts from now): a minutely entry down for about a month.
_MAX_CATCH_UP = 50_000


class Schedule(ABC):
    """When an actor runs, and with which arguments and slot name."""

    def __init__(
        self,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.name = None if name is None else validate_name("name", name)

    @abstractmethod
    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after ``moment`` (aware UTC)."""

    def latest_due(self, first: datetime, now: datetime) -> datetime:
        """The last slot at or before ``now``, starting from the due slot ``first``.

        The slots in between were missed (during a hand-over, say); they are
        folded into this one send.
        """
        due = first
        for _ in range(_MAX_CATCH_UP):
            following = self.next_after(due)
            if following > now:
                return due
            due = following
        return due


class every(Schedule):  # lower case, like a function, as in the contract
    """Every ``seconds`` (fractions allowed), at multiples of the period since the epoch.

    ``every(60)`` runs at each full minute, ``every(0.2)`` five times a second.
    """

    def __init__(
        self,
        seconds: float,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(args, kwargs, name)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ConfigError(f"every() needs a number of seconds (got {seconds!r})")
        if not math.isfinite(seconds) or seconds < 0.001:
            raise ConfigError(f"every() needs at least 0.001 seconds (got {seconds!r})")
        self.seconds = float(seconds)
        # Whole microseconds, so that slot times are exact and agree on every host.
        self._period_us = round(seconds * 1_000_000)

    def next_after(self, moment: datetime) -> datetime:
        now_us = (moment - _EPOCH) // timedelta(microseconds=1)
        return _EPOCH + timedelta(microseconds=(now_us // self._period_us + 1) * self._period_us)

    def latest_due(self, first: datetime, now: datetime) -> datetime:
        now_us = (now - _EPOCH) // timedelta(microseconds=1)
        latest = _EPOCH + timedelta(microseconds=now_us // self._period_us * self._period_us)
        return max(first, latest)

    def __repr__(self) -> str:
        return f"every({self.seconds:g}{_extra(self)})"


class cron(Schedule):  # lower case, like a function, as in the contract
    """A cron expression read in ``tz`` (default UTC), computed by cronsim.

    On clock changes a 02:30 job runs once when the clock goes back and at
    03:00 when it jumps forward, as cron itself does.
    """

    def __init__(
        self,
        expression: str,
        *,
        tz: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(args, kwargs, name)
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

    def __repr__(self) -> str:
        return f"cron({self.expression!r}, tz={self.tz.key!r}{_extra(self)})"


def _extra(schedule: Schedule) -> str:
    return "" if schedule.name is None else f", name={schedule.name!r}"
