"""Clock changes and clock jumps without processes: CronSeries at Berlin's two clock
changes, the fall-back fold seen by a promotion, a clock that goes back, and the
``leader plan`` arithmetic (:mod:`celery_leader.schedule.plan`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from celery_leader.backends import Fence, Write, open_store
from celery_leader.probes import metrics
from celery_leader.schedule import plan as planning
from celery_leader.schedule import protocol
from celery_leader.schedule.jobs import Adapter, Job, Outcome
from celery_leader.schedule.series import CronSeries, Every
from celery_leader.schedule.state import dump_state
from celery_leader.settings.config import LeaderConfig
from tests import slot_protocols
from tests.slot_protocols import leading

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
ALL_DAYS = (range(1, 32), range(1, 13), range(7))
FALL = datetime(2026, 10, 25, tzinfo=UTC)  # 01:00 UTC: 03:00 CEST becomes 02:00 CET
SPRING = datetime(2026, 3, 29, tzinfo=UTC)  # 01:00 UTC: 02:00 CET becomes 03:00 CEST


def cron(minutes: Sequence[int], hours: Sequence[int]) -> CronSeries:
    days, months, weekdays = ALL_DAYS
    return CronSeries(BERLIN, minutes, hours, days, months, weekdays)


def slots(series: CronSeries, after: datetime, until: datetime) -> list[str]:
    """Due instants in ``(after, until]``, as Berlin wall times with their offsets."""
    found, moment = [], after
    while (due := series.next_after(moment)) is not None and due <= until:
        found.append(due.astimezone(BERLIN).strftime("%H:%M%z"))
        moment = due
    return found


def test_fall_back_every_hour_fires_in_both_repeated_hours_fixed_hour_once() -> None:
    window = (FALL - timedelta(hours=1), FALL + timedelta(hours=3))
    assert slots(cron([30], range(24)), *window) == [
        "01:30+0200", "02:30+0200", "02:30+0100", "03:30+0100",
    ]  # fmt: skip
    assert slots(cron([30], [2]), *window) == ["02:30+0200"]
    assert slots(cron([0, 15, 30, 45], range(24)), FALL, FALL + timedelta(hours=1)) == [
        "02:15+0200", "02:30+0200", "02:45+0200", "02:00+0100",
    ]  # fmt: skip


def test_spring_forward_every_hour_skips_the_missing_hour_fixed_hour_fires_at_the_jump() -> None:
    window = (SPRING - timedelta(hours=1), SPRING + timedelta(hours=2))
    assert slots(cron([30], range(24)), *window) == ["00:30+0100", "01:30+0100", "03:30+0200"]
    assert slots(cron([30], [2]), *window) == ["03:00+0200"]
    # Every quarter hour: nothing between 01:45 CET and 03:00 CEST (15 real minutes).
    assert slots(cron([0, 15, 30, 45], range(24)), *window)[5:8] == [
        "01:30+0100", "01:45+0100", "03:00+0200",
    ]  # fmt: skip


class _Recorder(Adapter):
    def __init__(self, jobs: list[Job]) -> None:
        self._jobs = jobs
        self.sent: list[str] = []

    def jobs(self) -> Sequence[Job]:
        return self._jobs

    def send(self, job: Job, slot: str, due: datetime, epoch: int) -> Outcome:
        self.sent.append(slot)
        return Outcome()


config = slot_protocols.config
made = slot_protocols.made


def test_state_31_minutes_old_read_at_0201_cet_on_fall_back_day_is_not_in_the_future(
    config: LeaderConfig,
    made: list[protocol.SlotProtocol],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Last slot 02:30 CEST (00:30 UTC); now 02:01 CET (01:01 UTC): on the wall clock the
    state looks 29 minutes ahead, in real time it is 31 minutes old."""
    job = Job("q15", cron([0, 15, 30, 45], range(24)), "once", None, BERLIN)
    backend = open_store(config)
    term = backend.lock.acquire("beat", "previous", config.ttl, 0).term
    assert term is not None
    raw = dump_state(FALL + timedelta(minutes=30), 5, term.epoch, "previous")
    assert all(backend.records.claim(Fence("beat", term), [Write("q15", None, raw)]))
    backend.lock.release("beat", term)
    monkeypatch.setattr(protocol, "utcnow", lambda: FALL + timedelta(minutes=61))
    adapter = _Recorder([job])
    slot_protocol = leading(config, adapter, made, max_sleep=0.05)
    with caplog.at_level(logging.WARNING):
        slot_protocol.tick()
        slot_protocol.tick()
    assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == []
    # 02:45 CEST and 02:00 CET were missed; "once" sends the newest.
    assert adapter.sent == ["q15@2026-10-25T02:00:00.000+01:00"]


def test_a_clock_that_goes_back_is_logged_once_and_nothing_is_resent(
    config: LeaderConfig,
    made: list[protocol.SlotProtocol],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [datetime(2026, 6, 1, 10, 0, 30, tzinfo=UTC)]
    monkeypatch.setattr(protocol, "utcnow", lambda: now[0])
    adapter = _Recorder([Job("min", Every(timedelta(minutes=1)), "all", None)])
    slot_protocol = leading(config, adapter, made, max_sleep=0.05)
    moments = [(10, 0, 30), (10, 1, 0), (10, 2, 1), (9, 2, 2), (9, 30, 0), (10, 1, 30), (10, 3, 0)]
    with caplog.at_level(logging.WARNING):
        for hour, minute, second in moments:
            now[0] = now[0].replace(hour=hour, minute=minute, second=second)
            slot_protocol.tick()
    back = [r for r in caplog.records if "the wall clock went back" in r.message]
    assert len(back) == 1 and "3599.0 s" in back[0].message
    assert adapter.sent == [
        "min@2026-06-01T10:01:00.000+00:00",
        "min@2026-06-01T10:02:00.000+00:00",
        "min@2026-06-01T10:03:00.000+00:00",
    ]


def test_missed_slots_are_reported_dropped_only_by_the_claim_that_records_them(
    config: LeaderConfig,
    made: list[protocol.SlotProtocol],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tick whose claim is lost records nothing, so the tick that wins the claim drops
    the same slots again: only that one may say so (the fake-clock fall-back test once
    counted 83 minutes as 82 sent + 2 dropped)."""
    job = Job("min", Every(timedelta(minutes=1)), "once", None)
    backend = open_store(config)
    term = backend.lock.acquire("beat", "previous", config.ttl, 0).term
    assert term is not None
    last = datetime(2026, 6, 1, 10, tzinfo=UTC)
    assert all(
        backend.records.claim(
            Fence("beat", term), [Write("min", None, dump_state(last, 1, 1, "x"))]
        )
    )
    backend.lock.release("beat", term)
    # 10:01, 10:02 and 10:03 are due: "once" sends 10:03 and drops two.
    monkeypatch.setattr(protocol, "utcnow", lambda: last + timedelta(minutes=3, seconds=30))
    counted: list[tuple[str, int]] = []
    monkeypatch.setattr(metrics, "count", lambda name, election, n=1: counted.append((name, n)))
    adapter = _Recorder([job])
    slot_protocol = leading(config, adapter, made, max_sleep=0.05)
    store = slot_protocol.runtime.store.records
    real_claim = store.claim

    def lost_once(fence: Fence, writes: list[Write]) -> list[bool]:
        # As if the term ended between reading the state and claiming the slots.
        monkeypatch.setattr(store, "claim", real_claim)
        return [False] * len(writes)

    monkeypatch.setattr(store, "claim", lost_once)
    with caplog.at_level(logging.INFO):
        slot_protocol.tick()
        assert adapter.sent == []
        slot_protocol.tick()
    assert adapter.sent == ["min@2026-06-01T10:03:00.000+00:00"]
    dropped = [r.message for r in caplog.records if "missed slot(s)" in r.message]
    assert len(dropped) == 1 and "not sending 2 missed slot(s) of 'min'" in dropped[0], dropped
    assert [n for name, n in counted if name == "missed_slots_dropped"] == [2]


# -- leader plan ---------------------------------------------------------------


def q15(policy: str = "once", grace: float | None = None) -> Job:
    return Job("q15", cron([0, 15, 30, 45], range(24)), policy, grace, BERLIN)


def fixed230(policy: str = "once") -> Job:
    return Job("fixed230", cron([30], [2]), policy, None, BERLIN)


def test_plan_lists_each_slot_as_sent_across_the_fall_back() -> None:
    result = planning.plan([fixed230(), q15()], FALL, FALL + timedelta(hours=2))
    assert [s.slot for s in result.slots] == [
        "q15@2026-10-25T02:15:00.000+02:00",
        "fixed230@2026-10-25T02:30:00.000+02:00",
        "q15@2026-10-25T02:30:00.000+02:00",
        "q15@2026-10-25T02:45:00.000+02:00",
        "q15@2026-10-25T02:00:00.000+01:00",
        "q15@2026-10-25T02:15:00.000+01:00",
        "q15@2026-10-25T02:30:00.000+01:00",
        "q15@2026-10-25T02:45:00.000+01:00",
        "q15@2026-10-25T03:00:00.000+01:00",
    ]
    assert all(s.sent_at == s.due for s in result.slots)


def test_plan_from_stored_state_applies_the_missed_slot_policy_at_the_start() -> None:
    start = SPRING + timedelta(hours=1)  # 03:00 CEST
    last = {"q15": SPRING}  # 01:00 CET: 01:15, 01:30, 01:45 and 03:00 are due since
    end = start + timedelta(minutes=20)

    def planned(policy: str, grace: float | None = None) -> list[tuple[str, bool]]:
        found = planning.plan([q15(policy, grace)], start, end, last)
        return [(s.slot.partition("T")[2][:5], s.sent_at != s.due) for s in found.slots]

    # 03:00 CEST is due exactly at the start: on time, like 03:15 after it.
    assert planned("once") == [("03:00", False), ("03:15", False)]
    assert planned("skip") == [("03:00", False), ("03:15", False)]
    assert planned("all") == [("01:15", True), ("01:30", True), ("01:45", True),
                              ("03:00", False), ("03:15", False)]  # fmt: skip
    assert planned("all", grace=20 * 60) == [("01:45", True), ("03:00", False), ("03:15", False)]
    late = planning.plan([q15("once")], start + timedelta(minutes=5), end, last)
    assert [(s.slot, s.sent_at) for s in late.slots] == [
        ("q15@2026-03-29T03:00:00.000+02:00", start + timedelta(minutes=5)),
        ("q15@2026-03-29T03:15:00.000+02:00", start + timedelta(minutes=15)),
    ]
    assert late.dropped == {"q15": 3}


def test_plan_never_lists_a_slot_the_store_recorded_and_repairs_far_future_state() -> None:
    start, end = FALL, FALL + timedelta(hours=1)
    ahead = planning.plan([q15()], start, end, {"q15": FALL + timedelta(minutes=40)})
    assert [s.due for s in ahead.slots] == [FALL + timedelta(minutes=45), FALL + timedelta(hours=1)]
    repaired = planning.plan([q15()], start, end, {"q15": FALL + timedelta(days=3)})
    assert len(repaired.slots) == 4


def test_plan_refuses_bad_windows_and_lists_what_it_cannot_plan() -> None:
    job = Job("tick", Every(timedelta(seconds=1)), "once", None)
    with pytest.raises(planning.PlanError, match=r"ends .* before it starts"):
        planning.plan([job], FALL, FALL - timedelta(seconds=1))
    with pytest.raises(planning.PlanError, match="longer than 366 days"):
        planning.plan([job], FALL, FALL + timedelta(days=367))
    with pytest.raises(planning.PlanError, match="more than 100000 slots"):
        planning.plan([job], FALL, FALL + timedelta(days=2))
    solar = Job("sunset", None, "once", None)
    assert planning.plan([solar], FALL, FALL + timedelta(days=1)).unplanned == ["sunset"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-10-25T02:30:00+01:00", FALL + timedelta(minutes=90)),
        ("2026-10-25T00:30Z", FALL + timedelta(minutes=30)),
        ("2026-10-25T04:00", FALL + timedelta(hours=3)),  # local: CET
        ("now", datetime(2026, 1, 1, tzinfo=UTC)),
    ],
)
def test_plan_reads_times_in_utc_with_an_offset_or_local(text: str, expected: datetime) -> None:
    assert planning.parse_moment(text, BERLIN, datetime(2026, 1, 1, tzinfo=UTC)) == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("2026-10-25T02:30", "happens twice in Europe/Berlin"),
        ("2026-03-29T02:30", "does not exist in Europe/Berlin"),
        ("tomorrow", "cannot read time 'tomorrow'"),
    ],
)
def test_plan_refuses_times_it_cannot_place(text: str, error: str) -> None:
    with pytest.raises(planning.PlanError, match=error):
        planning.parse_moment(text, BERLIN, FALL)
