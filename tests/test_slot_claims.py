"""A claim of a slot is refused unless the slot is after the one the stored state records.

The scheduler's side of the fenced-state contract: :class:`Claim` turns the
recorded and the claimed due instants into order keys the store compares.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from celery_leader.schedule.state import Claim, dump_state, order_key

T0 = datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc)
STORED = dump_state(T0, 1, 7, "a")


def slot(due: datetime) -> Claim:
    return Claim("x", STORED, dump_state(due, 2, 7, "a"), due=due)


def test_a_slot_not_after_the_stored_last_run_at_is_refused() -> None:
    # Due at the recorded instant, before it, and an hour before it written as the
    # same wall time in the repeated hour of a fall-back (02:30 CEST vs 02:30 CET).
    berlin = ZoneInfo("Europe/Berlin")
    same_wall = datetime(2026, 10, 25, 2, 30, tzinfo=berlin)  # fold=0: CEST, = T0
    for due in (T0, T0 - timedelta(seconds=1), same_wall, T0 - timedelta(hours=1)):
        assert not slot(due).admissible(), due
        assert not slot(due).write().in_order(), due
    for due in (T0 + timedelta(microseconds=1), same_wall.replace(fold=1)):
        assert slot(due).admissible(), due


def test_order_keys_sort_as_time_does() -> None:
    instants = [
        datetime(999, 1, 1, tzinfo=timezone.utc),
        T0,
        T0 + timedelta(microseconds=1),
        T0 + timedelta(seconds=1),
        datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo("Europe/Berlin")).replace(fold=1),
    ]
    assert sorted(instants, key=order_key) == sorted(instants)
    assert len({order_key(i) for i in instants}) == len(instants)


def test_claims_without_a_due_instant_or_a_readable_state_only_compare_and_set() -> None:
    assert Claim("x", STORED, "new").write().order is None
    unreadable = Claim("x", "not json", "new", due=T0)
    assert unreadable.write().after is None and unreadable.admissible()
    assert Claim("x", None, "new", due=T0).admissible()
