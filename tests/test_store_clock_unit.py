"""The store's clock as a lease measures it, in-process: :class:`StoreClock`'s samples,
and a lease on a memory store that reports a clock of its own, off this host's.

Everything runs on a :class:`~harness.manual_clock.ManualClock`; nothing sleeps.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from celery_leader import Lease
from celery_leader.backends import Acquired, Renewal, StoreParams, Term
from celery_leader.backends.memory import _STORES, MemoryLock
from celery_leader.clock import SAMPLES, StoreClock
from celery_leader.schedule.protocol import SlotProtocol
from celery_leader.settings.config import LeaderConfig
from harness.manual_clock import ManualClock

TTL = 0.5
RENEW = 0.15


# -- StoreClock ----------------------------------------------------------------


def test_offset_is_the_midpoint_of_the_round_trip_and_the_error_half_of_it() -> None:
    local = ManualClock()
    clock = StoreClock(local)
    assert not clock.measured and clock.offset is None and clock.time() == local.time()
    sent = local.monotonic()
    local.run(0.2)  # a 200 ms round trip; the store answered 600 s ahead of this host
    clock.sample(local.time() - 0.1 + 600.0, sent, local.monotonic())
    assert clock.offset == pytest.approx(600.0)
    assert clock.error == pytest.approx(0.1)
    assert clock.time() == pytest.approx(local.time() + 600.0)


def test_the_smallest_error_among_the_last_samples_wins() -> None:
    local = ManualClock()
    clock = StoreClock(local)
    # A quiet 2 ms round trip, then congested ones whose midpoint guess is 0.3 s off.
    sent = local.monotonic()
    local.run(0.002)
    clock.sample(local.time() - 0.001 + 5.0, sent, local.monotonic())
    for _ in range(SAMPLES - 1):
        sent = local.monotonic()
        local.run(0.8)
        clock.sample(local.time() - 0.1 + 5.0, sent, local.monotonic())
    assert clock.offset == pytest.approx(5.0)
    assert clock.error == pytest.approx(0.001)
    # Once the quiet sample is older than the window, the best of the rest counts.
    sent = local.monotonic()
    local.run(0.8)
    clock.sample(local.time() - 0.1 + 5.0, sent, local.monotonic())
    assert clock.offset == pytest.approx(5.3)
    assert clock.error == pytest.approx(0.4)
    assert clock.jumps == 0, "disagreement within the error bounds is no jump"


def test_resolution_centres_a_truncated_time_and_widens_the_error() -> None:
    local = ManualClock(wall=1_767_225_600.25)  # 0.25 s into a second
    clock = StoreClock(local)
    sent = local.monotonic()
    local.run(0.01)
    # etcd's Date: whole seconds, truncated; the store's clock equals this one.
    clock.sample(float(int(local.time() - 0.005)), sent, local.monotonic(), resolution=1.0)
    assert clock.error == pytest.approx(0.505)
    assert abs(clock.offset or 0.0) <= clock.error


def test_truncated_times_read_at_different_points_of_a_second_narrow_each_other() -> None:
    """etcd's whole-second Date leaves 0.5 s either way per sample; where the samples'
    bounds overlap the store's time is known far better (replicas whose guesses sat
    up to a second apart took over up to a second late)."""
    local = ManualClock(wall=1_767_225_600.0)
    clock = StoreClock(local)
    for into_second in (0.1, 0.9):  # the store's clock equals this host's
        local.run(into_second - (local.time() % 1.0) + 1.0)
        sent = local.monotonic()
        local.run(0.01)
        clock.sample(float(int(local.time() - 0.005)), sent, local.monotonic(), resolution=1.0)
    assert clock.error is not None and clock.error < 0.2
    assert abs(clock.offset or 0.0) <= clock.error


def test_a_step_of_the_local_wall_clock_does_not_move_the_store_time() -> None:
    local = ManualClock()
    clock = StoreClock(local)
    sent = local.monotonic()
    clock.sample(local.time(), sent, sent)
    before = clock.time()
    local._offset -= 3600.0  # this host's wall clock steps an hour back
    assert clock.time() == pytest.approx(before)
    assert clock.offset == pytest.approx(3600.0), "the offset to the wall clock shows it"


def test_a_store_clock_that_disagrees_beyond_both_bounds_is_a_jump() -> None:
    local = ManualClock()
    clock = StoreClock(local)
    for skew in (0.0, 0.0, 30.0, 30.0):
        sent = local.monotonic()
        local.run(0.01)
        clock.sample(local.time() - 0.005 + skew, sent, local.monotonic())
    assert clock.jumps == 1
    assert clock.last_jump == pytest.approx(30.0)
    assert clock.offset == pytest.approx(30.0), "the old server's samples are dropped"


# -- a lease on a store with a clock ----------------------------------------------


class SkewedStore(MemoryLock):
    """The memory store's lease lock, answering with a clock ``skew`` seconds off the test's."""

    clock_resolution = 1e-6

    def __init__(self, url: str, clock: ManualClock) -> None:
        super().__init__(StoreParams(url, "p", 0.1), clock)
        self.skew = 0.0

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        got = super().acquire(election, instance_id, ttl, min_epoch)
        return Acquired(got.term, got.holder, got.retry_after, self.clock.time() + self.skew)

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, float | None]:
        return super().renew(election, term, ttl)[0], self.clock.time() + self.skew


@pytest.fixture
def store() -> Iterator[SkewedStore]:
    url = f"memory://clock-{uuid.uuid4().hex[:8]}"
    yield SkewedStore(url, ManualClock())
    for key in [k for k in _STORES if k[0] == url]:
        del _STORES[key]


@pytest.fixture
def leases() -> Iterator[list[Lease]]:
    made: list[Lease] = []
    yield made
    for lease in made:
        lease.stop()


def _lease(leases: list[Lease], store: SkewedStore, source: str) -> Lease:
    lease = Lease(
        "clock",
        store,
        ttl=TTL,
        renew_interval=RENEW,
        instance_id=f"i-{source}",
        clock=store.clock,
        max_clock_skew=5.0,
        clock_source=source,
    )
    leases.append(lease)
    lease.start()
    return lease


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_skewed_host_warns_once_per_crossing_and_leads_on_the_store_clock(
    store: SkewedStore, leases: list[Lease], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "celery_leader")
    store.skew = -600.0  # this host runs 10 min ahead of the store
    lease = _lease(leases, store, "store")
    store.clock.run_until(lease.is_leader, 2.0, "never led")
    store.clock.run(5 * RENEW)
    assert lease.store_clock.offset == pytest.approx(-600.0, abs=0.01)
    assert lease.store_clock.time() == pytest.approx(store.clock.time() - 600.0, abs=0.01)
    warned = _lines(caplog, "more than leader_max_clock_skew")
    assert len(warned) == 1 and "+600.0 s off" in warned[0], warned
    assert lease.clock_problem is None and lease.is_leader()
    store.skew = 0.0  # NTP fixed it: the store's clock "jumped" against the samples
    store.clock.run(5 * RENEW)
    assert len(_lines(caplog, "back within 5 s")) == 1
    assert len(_lines(caplog, "jumped +600.0 s")) == 1
    store.skew = -600.0
    store.clock.run(5 * RENEW)
    assert len(_lines(caplog, "more than leader_max_clock_skew")) == 2, "once per crossing"


def test_with_local_clocks_a_skewed_host_does_not_lead_until_fixed(
    store: SkewedStore, leases: list[Lease], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "celery_leader")
    store.skew = 600.0  # this host runs 10 min behind
    lease = _lease(leases, store, "local")
    store.clock.run(10 * RENEW)
    assert not lease.is_leader()
    problem = lease.clock_problem
    assert problem is not None and "-600.0 s off" in problem and '"local"' in problem
    assert not _lines(caplog, "elected leader")
    store.skew = 0.0
    store.clock.run_until(lease.is_leader, 2.0, "never led after the clock was fixed")
    assert lease.clock_problem is None
    store.skew = 600.0  # the clock breaks while it leads: it hands over
    store.clock.run_until(lambda: not lease.is_leader(), 2.0, "kept leading")
    assert lease.last_demotion == "clock_skew"
    jumped = _lines(caplog, "jumped")
    assert jumped and all(
        'schedules on this host\'s clock (leader_clock "local")' in j for j in jumped
    )


def test_the_slot_protocol_runs_on_the_store_clock_unless_told_local(
    store: SkewedStore, leases: list[Lease]
) -> None:
    store.skew = 600.0
    lease = _lease(leases, store, "store")
    store.clock.run_until(lease.is_leader, 2.0, "never led")
    for source, expected in (("store", store.clock.time() + 600.0), ("local", None)):
        config = LeaderConfig.from_mapping({"leader_url": store.url, "leader_clock": source})
        protocol = SlotProtocol(config, None, logging.getLogger("t"), idle=1.0, max_sleep=1.0)  # type: ignore[arg-type]
        protocol.runtime._membership = SimpleNamespace(lease=lease)  # type: ignore[assignment]
        now = protocol.now().timestamp()
        if expected is None:
            assert now == pytest.approx(datetime.now(timezone.utc).timestamp(), abs=5.0)
        else:
            assert now == pytest.approx(expected, abs=0.01)
