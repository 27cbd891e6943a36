"""Edits between ticks, without processes: a re-timed job recomputes its next due time at
once, a job that was gone (paused, disabled, removed) sends nothing from that time, and a
re-created job (another ``generation``) starts fresh. One slot protocol on the memory store,
driven by a fake adapter and a wall clock the test sets."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from celery_leader.backends import Fence, Write, open_store
from celery_leader.dramatiq import cron, every
from celery_leader.schedule import protocol
from celery_leader.schedule.jobs import Adapter, Job, Outcome
from celery_leader.schedule.series import CronSeries, Every
from celery_leader.schedule.state import dump_state, parse_state
from celery_leader.settings.config import LeaderConfig
from tests import slot_protocols
from tests.slot_protocols import leading

UTC = timezone.utc
T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)  # a whole minute: on every grid below


def seconds(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def name(entry: str, n: float) -> str:
    return f"{entry}@{seconds(n).isoformat(timespec='milliseconds')}"


class Editable(Adapter):
    """An adapter whose jobs the test edits between ticks."""

    def __init__(self, *jobs: Job) -> None:
        self.jobs_now = list(jobs)
        self.sent: list[str] = []

    def jobs(self) -> Sequence[Job]:
        return list(self.jobs_now)

    def replace(self, entry: str, **changes: object) -> None:
        self.jobs_now = [
            dataclasses.replace(j, **changes) if j.name == entry else j  # type: ignore[arg-type]
            for j in self.jobs_now
        ]

    def remove(self, entry: str) -> Job:
        (job,) = [j for j in self.jobs_now if j.name == entry]
        self.jobs_now.remove(job)
        return job

    def send(self, job: Job, slot: str, due: datetime, epoch: int) -> Outcome:
        self.sent.append(slot)
        return Outcome()

    def take(self) -> list[str]:
        sent, self.sent = self.sent, []
        return sent


class Now:
    def __init__(self) -> None:
        self.at = T0

    def __call__(self) -> datetime:
        return self.at

    def to(self, n: float) -> None:
        self.at = seconds(n)


config = slot_protocols.config
made = slot_protocols.made


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> Now:
    clock = Now()
    monkeypatch.setattr(protocol, "utcnow", clock)
    return clock


def stored(config: LeaderConfig) -> dict[str, dict[str, object]]:
    backend = open_store(config)
    return {k: json.loads(v) for k, v in backend.records.load("beat").items()}


def seed(config: LeaderConfig, states: dict[str, str]) -> None:
    """Write state as a previous leader would: a fenced claim under its own term."""
    backend = open_store(config)
    term = backend.lock.acquire("beat", "previous-leader", config.ttl, 0).term
    assert term is not None
    claims = [Write(entry, None, raw) for entry, raw in states.items()]
    assert all(backend.records.claim(Fence("beat", term), claims))
    backend.lock.release("beat", term)


def every_s(n: float) -> Every:
    return Every(timedelta(seconds=n))


# -- a changed schedule ---------------------------------------------------------------


def test_a_shortened_interval_sends_its_first_new_slot_at_once_not_after_the_old_period(
    config: LeaderConfig, now: Now, made: list[protocol.SlotProtocol]
) -> None:
    adapter = Editable(Job("r", every_s(30), "all", None))
    slot_protocol = leading(config, adapter, made)
    now.to(0.5)
    slot_protocol.tick()  # anchored at slot 0
    now.to(30.1)
    slot_protocol.tick()
    assert adapter.take() == [name("r", 30)]
    now.to(35.3)
    assert slot_protocol.tick() == pytest.approx(24.7)  # the 30 s series' next slot
    # Re-timed to 2 s at 35.3: the 2 s slots at 32 and 34 fell before the edit.
    adapter.replace("r", series=every_s(2), active_since=seconds(35.3))
    wait = slot_protocol.tick()
    assert adapter.take() == []
    assert wait == pytest.approx(0.7)  # the next 2 s slot, not the old series' 60
    now.to(36.0)
    slot_protocol.tick()
    now.to(38.0)
    slot_protocol.tick()
    assert adapter.take() == [name("r", 36), name("r", 38)]


def test_a_series_changed_without_active_since_still_recomputes_its_next_due_time(
    config: LeaderConfig, now: Now, made: list[protocol.SlotProtocol]
) -> None:
    """Code entries carry no ``active_since``: a new series by value is enough."""
    adapter = Editable(Job("r", every_s(60), "skip", None))
    slot_protocol = leading(config, adapter, made)
    slot_protocol.tick()
    now.to(1.5)
    assert slot_protocol.tick() == pytest.approx(58.5)
    adapter.replace("r", series=every_s(60))  # an equal series, rebuilt: nothing changes
    assert slot_protocol.tick() == pytest.approx(58.5)
    adapter.replace("r", series=every_s(1))
    slot_protocol.tick()
    assert adapter.take() == [name("r", 1)]


def test_series_keys_compare_by_value() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    fields = ([0], [3], range(1, 32), range(1, 13), range(7))
    assert every_s(2).key() == Every(timedelta(milliseconds=2000)).key()
    assert every_s(2).key() != every_s(3).key()
    assert CronSeries(berlin, *fields).key() == CronSeries(ZoneInfo("Europe/Berlin"), *fields).key()
    assert CronSeries(berlin, *fields).key() != CronSeries(UTC, *fields).key()
    assert every(2).key() == every(2, name="x").key() == every_s(2).key()
    assert (
        cron("0 3 * * *", tz="Europe/Berlin").key() == cron("0 3 * * *", tz="Europe/Berlin").key()
    )
    assert cron("0 3 * * *").key() != cron("0 4 * * *").key()


# -- paused, disabled, removed ------------------------------------------------------


def test_a_job_back_after_a_pause_sends_nothing_from_the_pause_under_all(
    config: LeaderConfig, now: Now, made: list[protocol.SlotProtocol]
) -> None:
    adapter = Editable(Job("p", every_s(2), "all", None))
    slot_protocol = leading(config, adapter, made)
    slot_protocol.tick()
    now.to(2)
    slot_protocol.tick()
    assert adapter.take() == [name("p", 2)]
    job = adapter.remove("p")  # paused at 3
    now.to(3)
    slot_protocol.tick()
    assert "p" not in slot_protocol.held.states  # forgotten while gone
    now.to(18.5)
    slot_protocol.tick()
    adapter.jobs_now.append(dataclasses.replace(job, active_since=seconds(18.5)))
    slot_protocol.tick()
    assert adapter.take() == []  # 4 ... 18 fell while it was paused
    now.to(20)
    slot_protocol.tick()
    assert adapter.take() == [name("p", 20)]
    assert stored(config)["p"]["total_run_count"] == 2


def test_a_new_leader_honours_active_since_of_a_job_resumed_before_its_promotion(
    config: LeaderConfig, now: Now, made: list[protocol.SlotProtocol]
) -> None:
    """The rule lives in the job, not in the memory of the leader that saw the resume."""
    seed(config, {"p": dump_state(seconds(2), 1, 0, "previous")})
    now.to(30)
    adapter = Editable(Job("p", every_s(2), "all", None, active_since=seconds(25)))
    slot_protocol = leading(config, adapter, made)
    slot_protocol.tick()
    slot_protocol.tick()
    # 26, 28 and 30 are missed slots of the resumed entry; 4 ... 24 were never due.
    assert adapter.take() == [name("p", 26), name("p", 28), name("p", 30)]


def test_active_since_on_a_slot_counts_that_slot(
    config: LeaderConfig, now: Now, made: list[protocol.SlotProtocol]
) -> None:
    seed(config, {"p": dump_state(seconds(2), 1, 0, "previous")})
    now.to(10)
    adapter = Editable(Job("p", every_s(2), "all", None, active_since=seconds(8)))
    slot_protocol = leading(config, adapter, made)
    slot_protocol.tick()
    assert adapter.take() == [name("p", 8), name("p", 10)]


# -- re-created ---------------------------------------------------------------------


def test_a_re_created_job_starts_fresh_and_backfills_nothing_under_all(
    config: LeaderConfig,
    now: Now,
    made: list[protocol.SlotProtocol],
    caplog: pytest.LogCaptureFixture,
) -> None:
    seed(config, {"r": dump_state(seconds(-600), 7, 0, "previous", generation="row-1")})
    now.to(0.5)
    adapter = Editable(Job("r", every_s(2), "all", None, generation="row-2"))
    slot_protocol = leading(config, adapter, made)
    with caplog.at_level(logging.INFO):
        slot_protocol.tick()
    assert adapter.take() == []
    assert any("re-created" in r.message for r in caplog.records)
    state = stored(config)["r"]
    assert (state["generation"], state["total_run_count"]) == ("row-2", 0)
    now.to(2)
    slot_protocol.tick()
    assert adapter.take() == [name("r", 2)]
    assert stored(config)["r"]["generation"] == "row-2"


def test_a_job_re_created_between_two_ticks_is_re_anchored(
    config: LeaderConfig, now: Now, made: list[protocol.SlotProtocol]
) -> None:
    """Deleted and re-created with no tick in between: the name never left the jobs."""
    adapter = Editable(Job("r", every_s(2), "all", None, generation="a"))
    slot_protocol = leading(config, adapter, made)
    slot_protocol.tick()
    now.to(2)
    slot_protocol.tick()
    assert adapter.take() == [name("r", 2)]
    now.to(11)
    adapter.replace("r", generation="b")
    slot_protocol.tick()
    assert adapter.take() == []  # 4 ... 10 belong to nobody
    assert stored(config)["r"]["generation"] == "b"
    now.to(12)
    slot_protocol.tick()
    assert adapter.take() == [name("r", 12)]


def test_state_without_a_generation_is_adopted_and_then_records_it(
    config: LeaderConfig, now: Now, made: list[protocol.SlotProtocol]
) -> None:
    """State from before generations existed belongs to the entry: nothing is lost."""
    seed(config, {"r": dump_state(seconds(0), 3, 0, "previous")})
    now.to(4)
    adapter = Editable(Job("r", every_s(2), "all", None, generation="g"))
    slot_protocol = leading(config, adapter, made)
    slot_protocol.tick()
    slot_protocol.tick()
    assert adapter.take() == [name("r", 2), name("r", 4)]
    state = stored(config)["r"]
    assert (state["generation"], state["total_run_count"]) == ("g", 5)


def test_parse_state_reads_old_states_and_refuses_a_generation_that_is_not_text() -> None:
    old = '{"last_run_at": "2026-06-01T10:00:00+00:00", "total_run_count": 2}'
    parsed = parse_state(old)
    assert parsed is not None and parsed.generation is None
    assert parse_state(dump_state(T0, 2, 1, "me", generation="x")).generation == "x"  # type: ignore[union-attr]
    assert parse_state(old[:-1] + ', "generation": 5}') is None
    assert parse_state("[1, 2]") is None


def test_a_resume_is_stored_at_once_and_a_successor_that_never_saw_it_honours_it(
    config: LeaderConfig, now: Now, made: list[protocol.SlotProtocol]
) -> None:
    """The leader that saw the resume dies before the entry's next slot; its successor's
    job carries no ``active_since`` (it did not see the resume): the store says it."""
    job = Job("p", every_s(10), "all", None)
    seed(config, {"p": dump_state(seconds(0), 1, 0, "previous")})
    now.to(41)
    adapter = Editable(dataclasses.replace(job, active_since=seconds(41)))
    first = leading(config, adapter, made)
    first.tick()
    assert adapter.take() == []  # 10 ... 40 fell while it was paused
    assert stored(config)["p"]["active_since"] == seconds(41).isoformat()
    first.close()
    now.to(62)
    successor = Editable(job)
    leading(config, successor, made).tick()
    assert successor.take() == [name("p", 50), name("p", 60)]
    assert stored(config)["p"]["active_since"] == seconds(41).isoformat()


def test_parse_state_reads_active_since_and_refuses_one_that_is_not_an_instant() -> None:
    raw = dump_state(T0, 2, 1, "me", active_since=seconds(5))
    assert parse_state(raw).active_since == seconds(5)  # type: ignore[union-attr]
    assert parse_state(raw.replace(seconds(5).isoformat(), "soon")) is None


def test_leader_plan_from_stored_state_follows_the_same_rules() -> None:
    """``leader plan --stored``: nothing from before a resume, nothing of another lifetime."""
    from celery_leader.schedule import plan as planning

    series = every_s(10)
    jobs = [
        Job("resumed", series, "all", None),
        Job("recreated", series, "all", None, generation="new"),
        Job("plain", series, "all", None),
    ]
    stored = {
        "resumed": dump_state(seconds(0), 1, 1, "x", active_since=seconds(35)),
        "recreated": dump_state(seconds(0), 1, 1, "x", generation="old"),
        "plain": dump_state(seconds(0), 1, 1, "x"),
    }
    last_runs = planning.stored_last_runs(stored, jobs)
    assert set(last_runs) == {"resumed", "plain"}
    result = planning.plan(jobs, seconds(41), seconds(50), last_runs)
    sent = sorted((s.entry, s.due) for s in result.slots)
    assert sent == [
        ("plain", seconds(10)), ("plain", seconds(20)), ("plain", seconds(30)),
        ("plain", seconds(40)), ("plain", seconds(50)),
        ("recreated", seconds(50)),
        ("resumed", seconds(40)), ("resumed", seconds(50)),
    ]  # fmt: skip


class _AskedOnly(Editable):
    """Jobs without a series (Celery's solar and custom schedules): the adapter says."""

    def __init__(self, *jobs: Job) -> None:
        super().__init__(*jobs)
        self.due: datetime | None = None

    def due_now(self, job: Job, now: datetime) -> tuple[datetime | None, float]:
        return self.due, 1.0


def test_a_job_without_a_series_records_a_slot_due_before_active_since_unsent(
    config: LeaderConfig, now: Now, made: list[protocol.SlotProtocol]
) -> None:
    adapter = _AskedOnly(Job("solar", None, "all", None, active_since=seconds(30)))
    slot_protocol = leading(config, adapter, made)
    slot_protocol.tick()  # anchored at now
    now.to(31)
    adapter.due = seconds(20)  # what the schedule says, from before the resume
    slot_protocol.tick()
    assert adapter.take() == []
    assert stored(config)["solar"]["last_run_at"] == seconds(20).isoformat()
    now.to(41)
    adapter.due = seconds(40)
    slot_protocol.tick()
    assert adapter.take() == [name("solar", 40)]
