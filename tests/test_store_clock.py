"""Real schedulers whose clocks disagree by ±10 minutes, scheduling on the store's clock.

Three replicas (``celery beat -S leader``, or ``python -m celery_leader.dramatiq``)
run on fake clocks at +0, +10 min and -10 min from real time
(:class:`harness.fakeclock.FakeClock` at real speed) on one lease store, with the
default ``leader_clock = "store"``. Leadership moves four times (SIGKILL, SIGTERM,
SIGKILL, SIGTERM), through every clock (the third replica steps out meanwhile).
Every slot of the every-5 s entry ``five`` must be published within -1 s ... +3 s
of its due time by the store's clock, with no gap over 10 s in the due times and
nothing sent twice.

A poller reads the broker every :data:`POLL` seconds and the store's clock around
each read: a slot first seen by one read was published after the store time taken
before the previous read and before the one taken after this read, so both bounds
are checked conservatively.

Run with ``-s`` to see the hand-overs and the measured lateness.
"""

from __future__ import annotations

import itertools
import signal
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from harness.fakeclock import FakeClock
from harness.fleet import Fleet, Sent, duplicates
from harness.procs import Procs

pytestmark = [pytest.mark.slow, pytest.mark.paced]

#: Seconds between two reads of the broker.
POLL = 0.05
#: A slot published this much before its due time by the store's clock fails ...
EARLY = 1.0
#: ... and this much after it (the issue's budget: a hand-over included).
LATE = 3.0
#: The longest allowed gap between the due times of consecutive slots (two periods).
MAX_GAP = 10.0


class Publications:
    """When each slot of ``entry`` was published, on the store's clock, bounded by two reads."""

    def __init__(self, fleet: Fleet, entry: str) -> None:
        self.fleet = fleet
        self.entry = entry
        #: slot -> (store time before the read before the one that saw it, after that read)
        self.seen: dict[str, tuple[float, float]] = {}
        self._previous = fleet.store_time()  # taken before the last read
        #: Slots in the broker before the first read: when they were published is unknown.
        self.earlier = {s.slot for s in fleet.sent()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publications", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL):
            self._read()

    def _read(self) -> list[Sent]:
        before = self.fleet.store_time()
        sent = self.fleet.sent()
        after = self.fleet.store_time()
        for item in sent:
            if item.entry == self.entry and item.slot not in self.earlier:
                self.seen.setdefault(item.slot, (self._previous, after))
        self._previous = before
        return sent

    def stop(self) -> list[Sent]:
        """Stop reading; every slot of the entry in the broker, after one last read."""
        self._stop.set()
        self._thread.join(timeout=10)
        return [s for s in self._read() if s.entry == self.entry]


@pytest.fixture
def clock(tmp_path: Path) -> Iterator[FakeClock]:
    directory = tmp_path / "clock"
    directory.mkdir()
    made = FakeClock(directory, datetime.now(timezone.utc), 1.0)
    made.run()
    made.shift("ahead", timedelta(minutes=10))
    made.shift("behind", -timedelta(minutes=10))
    yield made
    made.close()


@pytest.mark.parametrize(
    ("kind", "store"),
    [("beat", "redis"), ("beat", "postgres"), ("dramatiq", "redis")],
)
def test_skewed_replicas_schedule_on_the_store_clock(
    kind: str, store: str, procs: Procs, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    redis_url: str = request.getfixturevalue("redis_url")
    leader_url = request.getfixturevalue("postgres_url") if store == "postgres" else None
    fleet = Fleet(kind, procs, clock, redis_url, 0, {"CLOCK_EVERY5": "1"}, leader_url)
    ahead = fleet.start("ahead")  # the first leader runs 10 minutes fast
    fleet.leader()
    main, behind = fleet.spawn("main"), fleet.spawn("behind")
    fleet.ready(main)
    fleet.ready(behind)
    watch = Publications(fleet, "five")

    def move(to: str, other: str, sig: int) -> tuple[str, str]:
        """Hand over from the leader to ``to`` by ``sig``. ``other``, which must not win,
        leaves first (SIGTERM) and comes back after: a paused one would keep its place
        in PostgreSQL's lock queue and hold up the hand-over by its session's ttl.
        Replacements start on the clocks of the two that left; returns them."""
        old, epoch = fleet.leader()
        fleet.proc(other).signal(signal.SIGTERM)
        fleet.proc(other).wait(timeout=30)
        fleet.proc(old).signal(sig)
        new, _ = fleet.leader(newer_than=epoch)
        assert new == to, (old, new, to)
        print(f"{signal.Signals(sig).name}: {old} -> {new}")
        fleet.proc(old).wait(timeout=30)
        return fleet.start(fleet.replicas[old][1]), fleet.start(fleet.replicas[other][1])

    def after(seconds: float) -> None:
        clock.wait_until(clock.now() + timedelta(seconds=seconds), timeout=seconds + 5)

    after(8)
    ahead, main = move(behind, main, signal.SIGKILL)  # +10 -> -10
    after(8)
    behind, ahead = move(main, ahead, signal.SIGTERM)  # -10 -> +0
    after(8)
    main, behind = move(ahead, behind, signal.SIGKILL)  # +0 -> +10
    after(8)
    move(behind, main, signal.SIGTERM)  # +10 -> -10
    after(8)
    sent = watch.stop()
    fleet.stop()

    twice, _ = duplicates(sent)
    assert not twice, twice
    dues = sorted(s.due for s in sent)
    assert len(dues) >= 40 / 5, f"only {len(dues)} slots of 'five'"
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(dues)]
    early, late = [], []
    for item in sent:
        if item.slot in watch.earlier:
            continue
        due = item.due.timestamp()
        lower, upper = watch.seen[item.slot]
        early.append(lower - due)
        late.append(upper - due)
    print(
        f"{kind} on {store}: {len(dues)} slots, 0 twice, largest gap {max(gaps):.1f} s, "
        f"published {min(early):+.2f} s ... {max(late):+.2f} s from due (store clock)"
    )
    assert max(gaps) <= MAX_GAP, gaps
    assert min(early) >= -EARLY, sorted(early)[:5]
    assert max(late) <= LATE, sorted(late)[-5:]
