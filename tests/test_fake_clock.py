"""Real schedulers on a fake wall clock (harness.fakeclock): clock changes, jumps, skew.

Three ``celery beat -S leader`` replicas and three ``python -m celery_leader.dramatiq``
schedulers run side by side (separate brokers and elections) on one fake clock that
runs 60 times faster than real time (:class:`harness.fakeclock.FakeClock`), with
entries that clock changes trouble: a 02:30 crontab, a quarter-hourly one and a
60 s interval, each under ``leader_missed_slots = "once"`` and ``"all"`` (entries
``<name>-once`` and ``<name>-all``; tests/apps/clock_app.py and clock_dramatiq.py).
Leaders are SIGKILLed and SIGTERMed at chosen fake instants; every slot sent is read
back from the broker, where nothing consumes it.

Run with ``-s`` to see the slots sent.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from celery_leader.cli import commands as ops
from celery_leader.settings.config import LeaderConfig
from harness.fakeclock import FakeClock
from harness.fleet import OWN_CLOCK, Fleet, Sent, duplicates, minutes
from harness.procs import Procs

pytestmark = [pytest.mark.slow, pytest.mark.paced]

UTC = timezone.utc
SPEED = 60.0
POLICIES = ("once", "all")


@pytest.fixture
def clock_dir(tmp_path: Path) -> Path:
    path = tmp_path / "clock"
    path.mkdir()
    return path


@pytest.fixture
def make_clock(clock_dir: Path) -> Iterator[list[FakeClock]]:
    clocks: list[FakeClock] = []
    yield clocks
    for clock in clocks:
        clock.close()


def _fleets(
    procs: Procs, clock: FakeClock, redis_url: str, env: dict[str, str] | None = None
) -> list[Fleet]:
    # What is tested here is scheduling on each replica's own clock.
    env = {"CLOCK_POLICIES": ",".join(POLICIES), **OWN_CLOCK, **(env or {})}
    return [
        Fleet("beat", procs, clock, redis_url, 0, env),
        Fleet("dramatiq", procs, clock, redis_url, 2, env),
    ]


def _dropped(fleet: Fleet, entry: str) -> int:
    """Missed slots of ``entry`` that its fleet's leaders logged as not sent (the policy)."""
    pattern = re.compile(rf"not sending (\d+) missed slot\(s\) of '{re.escape(entry)}'")
    return sum(
        int(match[1])
        for proc, _ in fleet.replicas.values()
        for match in pattern.finditer(proc.output())
    )


def _in(sent: list[Sent], start: datetime, end: datetime, prefix: str) -> list[Sent]:
    return [s for s in sent if start < s.due <= end and s.entry.startswith(prefix)]


def _check_window(
    fleet: Fleet,
    start: datetime,
    end: datetime,
    fixed230: datetime,
) -> None:
    """What a clock-change window must show, for both policies (see the module docstring)."""
    sent = fleet.sent()
    print(f"\n{fleet.kind}: {len(sent)} slots")
    for s in sent:
        if not s.entry.startswith("min-"):
            print(f"  {s.slot} (epoch {s.epoch})")
    names, dues = duplicates(sent)
    assert names == [] and dues == [], (fleet.kind, names, dues)
    planned = {p["slot"] for p in fleet.plan(start, end)}
    for policy in POLICIES:
        fixed = _in(sent, start, end, f"fixed230-{policy}")
        assert [s.due for s in fixed] == [fixed230], (fleet.kind, policy, fixed)
        q15 = _in(sent, start, end, f"q15-{policy}")
        assert sorted(s.due for s in q15) == minutes(start, end, 15), (fleet.kind, policy, q15)
        every = _in(sent, start, end, f"min-{policy}")
        missing = set(minutes(start, end)) - {s.due for s in every}
        if policy == "all":
            assert missing == set(), (fleet.kind, sorted(missing))
        else:
            # ``once`` sends the newest slot missed in a fail-over (or in a tick that came
            # late), not the others: each minute was sent or its drop logged.
            dues = sorted(s.due for s in sent if s.entry == f"min-{policy}")
            span = len(minutes(dues[0] - timedelta(minutes=1), dues[-1]))
            assert span == len(dues) + _dropped(fleet, f"min-{policy}"), (fleet.kind, missing)
        # ``leader plan`` over the same window lists exactly what was sent (``all``), and
        # a superset of it (``once``, which drops what fail-overs missed).
        window = {s.slot for s in sent if start < s.due <= end and s.entry.endswith(policy)}
        mine = {p for p in planned if p.partition("@")[0].endswith(f"-{policy}")}
        if policy == "all":
            assert window == mine, (fleet.kind, sorted(window ^ mine))
        else:
            assert window <= mine, (fleet.kind, sorted(window - mine))


def _run_clock_change(
    procs: Procs,
    clocks: list[FakeClock],
    clock_dir: Path,
    redis_url: str,
    begin: datetime,
    start: datetime,
    end: datetime,
    faults: list[tuple[datetime, int]],
) -> list[Fleet]:
    clock = FakeClock(clock_dir, begin, SPEED)
    clocks.append(clock)
    fleets = _fleets(procs, clock, redis_url)
    started = [(fleet, fleet.spawn()) for fleet in fleets for _ in range(3)]
    for fleet, instance in started:
        fleet.ready(instance)
    for fleet in fleets:
        fleet.leader()
    clock.run()
    for moment, sig in faults:
        clock.wait_until(moment)
        signalled = [(fleet, *fleet.signal_leader(sig)) for fleet in fleets]
        for fleet, old, epoch in signalled:
            new, new_epoch = fleet.replace(old, epoch)
            what = signal.Signals(sig).name
            print(f"{clock.now():%H:%M:%S} {fleet.kind}: {what} {old}; {new} leads ({new_epoch})")
    clock.wait_until(end + timedelta(minutes=1))
    for fleet in fleets:
        fleet.stop()
    return fleets


def test_fall_back_in_berlin(
    procs: Procs, make_clock: list[FakeClock], clock_dir: Path, redis_url: str
) -> None:
    """2026-10-25: 03:00 CEST becomes 02:00 CET; 02:00-03:00 happens twice (00:00-02:00 UTC).

    Faults: SIGKILL at 02:29:30 CEST (before the only 02:30), SIGTERM at 02:59:30 CEST
    (the last half minute before the change), SIGKILL at 02:29:30 CET (before the 02:30
    that must not fire again). Each successor is promoted inside the repeated hour.
    """
    day = datetime(2026, 10, 25, tzinfo=UTC)
    faults = [
        (day + timedelta(minutes=29, seconds=30), signal.SIGKILL),
        (day + timedelta(minutes=59, seconds=30), signal.SIGTERM),
        (day + timedelta(minutes=89, seconds=30), signal.SIGKILL),
    ]
    start, end = day + timedelta(minutes=20), day + timedelta(minutes=100)
    fleets = _run_clock_change(
        procs, make_clock, clock_dir, redis_url, day + timedelta(minutes=17), start, end, faults
    )
    for fleet in fleets:
        _check_window(fleet, start, end, day + timedelta(minutes=30))


def test_spring_forward_in_berlin(
    procs: Procs, make_clock: list[FakeClock], clock_dir: Path, redis_url: str
) -> None:
    """2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC); 02:00-03:00 does not happen.

    Faults: SIGKILL at 01:59:30 CET (before the jump, where the 02:30 entry fires once),
    SIGTERM at 03:09:30 CEST. No phantom slot in the missing hour, even with ``all``.
    """
    day = datetime(2026, 3, 29, tzinfo=UTC)
    faults = [
        (day + timedelta(minutes=59, seconds=30), signal.SIGKILL),
        (day + timedelta(minutes=69, seconds=30), signal.SIGTERM),
    ]
    start, end = day + timedelta(minutes=38), day + timedelta(minutes=82)
    fleets = _run_clock_change(
        procs, make_clock, clock_dir, redis_url, day + timedelta(minutes=35), start, end, faults
    )
    for fleet in fleets:
        _check_window(fleet, start, end, day + timedelta(hours=1))


def _log(fleet: Fleet, instance: str) -> str:
    return fleet.proc(instance).output()


def test_a_leader_whose_clock_jumps_back_then_forward_sends_nothing_twice(
    procs: Procs, make_clock: list[FakeClock], clock_dir: Path, redis_url: str
) -> None:
    """One leader per framework; its wall clock goes back an hour, returns, then jumps an
    hour ahead. Back: nothing is sent again, one WARNING. Ahead: ``once`` sends the newest
    slot it jumped over, ``all`` every one of them, each once."""
    day = datetime(2026, 6, 1, 10, tzinfo=UTC)
    clock = FakeClock(clock_dir, day, SPEED)
    make_clock.append(clock)
    fleets = _fleets(procs, clock, redis_url)
    leaders = [fleet.spawn("jumpy") for fleet in fleets]
    for fleet, instance in zip(fleets, leaders):
        fleet.ready(instance)
        fleet.leader()
    clock.run()
    clock.wait_until(day + timedelta(minutes=6, seconds=30))
    # What was sent before a jump and what after is told by due time, read on the
    # true clock once the jump is made: a slot sent before it is due no later. (The
    # broker's content at the jump was no mark: a leader that noticed the jump
    # between the shift and the reading had sent part of its catch-up already.)
    clock.shift("jumpy", -timedelta(hours=1))
    back_at = clock.now()
    clock.wait_until(day + timedelta(minutes=10, seconds=30))
    for fleet, instance in zip(fleets, leaders):
        # Nothing was sent while the clock was an hour behind.
        assert [s for s in fleet.sent() if s.due > back_at] == [], fleet.kind
        assert _log(fleet, instance).count("the wall clock went back") == 1, fleet.kind
    clock.shift("jumpy", timedelta(hours=1))  # back to the true time
    clock.wait_until(day + timedelta(minutes=13, seconds=30))
    clock.shift("jumpy", timedelta(hours=1))  # an hour ahead
    ahead_at = clock.now()
    clock.wait_until(day + timedelta(minutes=16, seconds=30))
    for fleet in fleets:
        fleet.stop()
    for fleet, instance in zip(fleets, leaders):
        sent = fleet.sent()
        names, dues = duplicates(sent)
        assert names == [] and dues == [], (fleet.kind, names, dues)
        log = _log(fleet, instance)
        assert log.count("the wall clock went back") == 1, fleet.kind
        print(next(line for line in log.splitlines() if "the wall clock went back" in line))
        earlier = [s for s in sent if s.due <= ahead_at]
        jumped = [s for s in sent if s.due > ahead_at]
        for policy in POLICIES:
            last = max(s.due for s in earlier if s.entry == f"min-{policy}")
            mins = sorted(s.due for s in jumped if s.entry == f"min-{policy}")
            quarters = sorted(s.due for s in jumped if s.entry == f"q15-{policy}")
            print(f"{fleet.kind} {policy}: last slot {last:%H:%M} before the jump, then", end=" ")
            print(", ".join(f"{m:%H:%M}" for m in [*mins[:3], *quarters[:4]]), "...")
            if policy == "all":
                # Every slot the jump passed over, each once, then on time.
                assert mins == [last + timedelta(minutes=i + 1) for i in range(len(mins))]
                assert quarters[:4] == minutes(last, last + timedelta(hours=1), 15)
            else:
                # Only the newest slot the jump passed over, then on time.
                assert mins[0] - last >= timedelta(hours=1), (fleet.kind, last, mins)
                assert len([q for q in quarters if q <= mins[0]]) == 1, (fleet.kind, quarters)
                assert _dropped(fleet, f"min-{policy}") >= 59


def test_replicas_with_skewed_clocks_hand_over_four_times_and_send_nothing_twice(
    procs: Procs, make_clock: list[FakeClock], clock_dir: Path, redis_url: str
) -> None:
    """Beat replicas at +0, +10 min and -10 min; leadership moves +0 -> +10 -> -10 -> +0
    -> +10 (resign, SIGTERM, resign, SIGTERM; the follower that must not win is paused
    meanwhile). A leader behind the state another wrote waits, and says so once."""
    day = datetime(2026, 6, 1, 10, tzinfo=UTC)
    clock = FakeClock(clock_dir, day, SPEED)
    make_clock.append(clock)
    (fleet,) = _fleets(procs, clock, redis_url)[:1]
    clock.shift("ahead", timedelta(minutes=10))
    clock.shift("behind", -timedelta(minutes=10))
    exact = fleet.start("main")
    fleet.leader()
    ahead, behind = fleet.spawn("ahead"), fleet.spawn("behind")
    fleet.ready(ahead)
    fleet.ready(behind)
    clock.run()
    config = LeaderConfig.from_env({"CELERY_LEADER_URL": fleet.leader_url})

    def move(to: str, paused: str, by: str) -> str:
        old, epoch = fleet.leader()
        fleet.proc(paused).signal(signal.SIGSTOP)
        try:
            if by == "resign":
                ops.resign(config, lambda line: None, "beat", wait=False)
            else:
                fleet.proc(old).signal(signal.SIGTERM)
            new, _ = fleet.leader(newer_than=epoch)
        finally:
            fleet.proc(paused).signal(signal.SIGCONT)
        assert new == to, (old, new, to)
        print(f"{clock.now():%H:%M:%S} {by}: {old} -> {new}")
        if by == "sigterm":
            fleet.proc(old).wait(timeout=30)
        clock.wait_until(clock.now() + timedelta(minutes=5))
        return old

    clock.wait_until(day + timedelta(minutes=5))
    move(ahead, behind, "resign")  # +0 -> +10
    old = move(behind, exact, "sigterm")  # +10 -> -10: 20 minutes behind the state
    ahead = fleet.start("ahead")
    move(exact, ahead, "resign")  # -10 -> +0: still behind what +10 sent
    move(ahead, behind, "sigterm")  # +0 -> +10
    fleet.stop()
    sent = fleet.sent()
    names, dues = duplicates(sent)
    assert names == [] and dues == [], (names, dues)
    waits = "it waits until this clock passes that"
    for instance in fleet.replicas:
        for line in fleet.proc(instance).lines():
            if "WARNING" in line or "dispatching as leader" in line:
                print(instance, line)
    assert waits in _log(fleet, behind)
    assert waits in _log(fleet, exact)
    assert waits not in _log(fleet, old)
    assert waits not in _log(fleet, ahead)
    for policy in POLICIES:
        dues_of = sorted(s.due for s in sent if s.entry == f"min-{policy}")
        assert dues_of == sorted(set(dues_of))
