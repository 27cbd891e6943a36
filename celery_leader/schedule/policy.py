"""Which slots of a due entry to send: the missed-slot policy, as pure arithmetic.

A slot is *on time* when it fell due at or after ``promoted_at``; earlier unsent ones
were *missed*. ``once`` sends the newest missed slot only when none is on time, ``skip``
only on-time slots, ``all`` every missed one (the newest :data:`MAX_MISSED`), oldest
first; the grace drops older ones. Every slot chosen lies strictly after the stored
``last_run_at``, and the state recorded is the newest due slot, sent or dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .series import Series

#: ``leader_missed_slots = "all"`` sends at most this many missed slots of an
#: entry at once; older ones are dropped (and logged).
MAX_MISSED = 100

_MICROSECOND = timedelta(microseconds=1)


def later(first: datetime | None, second: datetime | None) -> datetime | None:
    """The later of two optional instants (``None``: no bound)."""
    if first is None or second is None:
        return second if first is None else first
    return max(first, second)


def counted_after(last_run_at: datetime, active_since: datetime | None) -> datetime:
    """The instant after which an entry's slots count: its last slot, or just before it became
    active if that is later. Slots due before ``active_since`` never existed for any policy;
    one due exactly at it counts."""
    if active_since is None:
        return last_run_at
    return max(last_run_at, active_since - _MICROSECOND)


@dataclass(frozen=True)
class DueSlots:
    """What one due entry sends now, and what the store records for it."""

    send: list[datetime]  # due instants to send, oldest first (UTC)
    dropped: int  # due slots not sent (missed, by the policy); a lower bound for crontabs
    record: datetime  # the new last_run_at: the newest due slot, sent or dropped


def due_slots(
    series: Series,
    last_run_at: datetime,
    now: datetime,
    promoted_at: datetime | None,
    policy: str,
    grace: float | None,
) -> DueSlots | None:
    """The slots of ``series`` due in ``(last_run_at, now]`` to send under ``policy``; ``None``
    when nothing is due. ``promoted_at`` ``None``: every due slot is on time (a dry run)."""
    dues, total = series.walk(last_run_at, now, MAX_MISSED + 1)
    if not dues:
        return None
    newest = dues[-1]
    on_time = newest if promoted_at is None or newest >= promoted_at else None
    missed = dues[:-1] if on_time is not None else dues
    if grace is not None:
        horizon = now - timedelta(seconds=grace)
        missed = [due for due in missed if due >= horizon]
    if policy == "skip":
        catch_up: list[datetime] = []
    elif policy == "once":
        catch_up = missed[-1:] if on_time is None else []
    else:
        catch_up = missed[-MAX_MISSED:]
    send = catch_up + ([on_time] if on_time is not None else [])
    return DueSlots(send, total - len(send), newest)
