"""The due-time index and what it buys, without processes: a tick touches only due entries,
a new term loads its state in chunks (most frequent entries first) and dispatches between
them, and jobs are listed again only when the adapter says they changed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone

import pytest

from celery_leader.backends import Fence, Write, open_store
from celery_leader.backends.memory import MemoryRecords
from celery_leader.schedule import protocol, sync
from celery_leader.schedule.due import DueIndex
from celery_leader.schedule.jobs import Adapter, Job, Outcome
from celery_leader.schedule.series import Every
from celery_leader.settings.config import LeaderConfig
from tests import slot_protocols
from tests.slot_protocols import leading

UTC = timezone.utc
T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)


def at(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def test_the_index_pops_due_entries_earliest_first_up_to_the_limit() -> None:
    index = DueIndex()
    index.set("b", at(2))
    index.set("a", at(1))
    index.set("c", at(3))
    index.set("gone", at(0))
    index.discard("gone")
    index.set("b", at(5))  # moved: its old pair dies
    assert index.seconds_until_next(at(0)) == pytest.approx(1.0)
    assert index.pop_due(at(10), limit=2) == ["a", "c"]
    assert "a" not in index and "b" in index and len(index) == 1
    assert index.pop_due(at(4.9), limit=10) == []
    assert index.pop_due(at(5), limit=10) == ["b"]
    assert index.seconds_until_next(at(5)) is None
    index.set("never", None)
    assert len(index) == 0


def test_the_index_rebuilds_its_heap_when_dead_pairs_pile_up() -> None:
    index = DueIndex()
    for n in range(5000):
        index.set("moving", at(n))
    assert len(index._heap) < 2 * 1 + 1024 + 2
    assert index.pop_due(at(10_000), limit=5) == ["moving"]


class Counting(Adapter):
    """Fixed jobs; counts how often the protocol lists them."""

    def __init__(self, jobs: list[Job], changed: bool) -> None:
        self._jobs = jobs
        self.changed = changed
        self.listed = 0
        self.sent: list[str] = []

    def jobs(self) -> Sequence[Job]:
        self.listed += 1
        return self._jobs

    def jobs_changed(self) -> bool:
        return self.changed

    def send(self, job: Job, slot: str, due: datetime, epoch: int) -> Outcome:
        self.sent.append(slot)
        return Outcome()


class Clock:
    def __init__(self) -> None:
        self.at = T0

    def __call__(self) -> datetime:
        return self.at


config = slot_protocols.config
made = slot_protocols.made


def test_a_new_term_loads_in_chunks_most_frequent_first_and_dispatches_between_them(
    config: LeaderConfig, made: list[protocol.SlotProtocol], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync, "LOAD_CHUNK", 2)
    monkeypatch.setattr(sync, "LOAD_SLICE", 0.0)  # one chunk per tick
    hourly = [Job(f"h{n}", Every(timedelta(hours=1)), "once", None) for n in range(5)]
    fast = Job("fast", Every(timedelta(seconds=1)), "once", None)
    adapter = Counting([*hourly, fast], changed=False)
    clock = Clock()
    slot_protocol = leading(config, adapter, made, clock)
    assert slot_protocol.tick() == 0.0  # more to load: tick again at once
    assert not slot_protocol.loaded()
    assert "fast" in slot_protocol.held.states  # in the first chunk
    clock.at = at(1)
    slot_protocol.tick()
    assert adapter.sent == [f"fast@{at(1).isoformat(timespec='milliseconds')}"]
    assert not slot_protocol.loaded()  # sent before the hourly entries were loaded
    while not slot_protocol.loaded():
        slot_protocol.tick()
    stored = open_store(config).records.load("beat")
    assert set(stored) == {"fast", *(j.name for j in hourly)}  # every entry anchored
    assert adapter.listed == 1  # listed once, at the start of the term


def test_jobs_are_listed_again_only_when_the_adapter_says_they_changed(
    config: LeaderConfig, made: list[protocol.SlotProtocol]
) -> None:
    adapter = Counting([Job("e", Every(timedelta(seconds=1)), "once", None)], changed=False)
    clock = Clock()
    slot_protocol = leading(config, adapter, made, clock)
    for n in range(5):
        clock.at = at(n)
        slot_protocol.tick()
    assert adapter.listed == 1
    adapter.changed = True
    slot_protocol.tick()
    assert adapter.listed == 2


def test_a_follower_holds_no_per_entry_state(
    config: LeaderConfig, made: list[protocol.SlotProtocol]
) -> None:
    adapter = Counting([Job("e", Every(timedelta(seconds=1)), "once", None)], changed=False)
    slot_protocol = leading(config, adapter, made, Clock())
    slot_protocol.tick()
    assert slot_protocol.held.states
    slot_protocol.lease.step_down("test", kind="test", sit_out=5.0)
    slot_protocol.tick()
    assert not slot_protocol.held.states and not slot_protocol.held.jobs
    assert len(slot_protocol.held.due) == 0


class Paged(Counting):
    """Lists its jobs a page a tick, as a large store schedule is read."""

    def __init__(self, pages: list[list[Job]]) -> None:
        super().__init__(pages[0], changed=False)
        self.later = pages[1:]

    def jobs_changed(self) -> bool:
        return bool(self.later)

    def jobs_complete(self) -> bool:
        return not self.later

    def job_edits(self) -> Mapping[str, Job | None]:
        page = self.later.pop(0)
        self._jobs = [*self._jobs, *page]
        return {job.name: job for job in page}


def test_a_store_that_reads_only_all_its_state_is_read_once_while_pages_come_in(
    config: LeaderConfig, made: list[protocol.SlotProtocol], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new term on a store without ``load_some`` (the file store) reads the whole
    state once, for every page of the listing: once a page per page made a large
    schedule's load quadratic."""
    reads = []
    load = MemoryRecords.load
    monkeypatch.setattr(MemoryRecords, "load_some", lambda self, election, keys: None)
    monkeypatch.setattr(MemoryRecords, "load", lambda self, e: reads.append(e) or load(self, e))
    every = Every(timedelta(hours=1))
    pages = [[Job(f"p{p}-{n}", every, "once", None) for n in range(3)] for p in range(4)]
    adapter = Paged(pages)
    slot_protocol = leading(config, adapter, made, Clock())
    while not slot_protocol.loaded() or adapter.later:
        slot_protocol.tick()
    assert set(slot_protocol.held.states) == {j.name for page in pages for j in page}
    assert reads == ["beat"], "one read for the four pages"
    assert slot_protocol.held._stored is None, "dropped once every page is in"


def test_the_memory_store_reads_the_state_of_some_keys(config: LeaderConfig) -> None:
    backend = open_store(config)
    term = backend.lock.acquire("beat", "me", config.ttl, 0).term
    assert term is not None

    assert all(
        backend.records.claim(Fence("beat", term), [Write("a", None, "1"), Write("b", None, "2")])
    )
    assert backend.records.load_some("beat", ["a", "missing"]) == {"a": "1"}
