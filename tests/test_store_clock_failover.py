"""A Sentinel fail-over to a replica whose clock is 30 s off: the store's clock jumps.

Three ``celery beat -S leader`` replicas schedule an every-1 s entry on the
store's clock (the default ``leader_clock = "store"``) through
``redis+sentinel://``. The Redis replica runs with its wall clock 30 s behind
or ahead of the master's (:mod:`harness.clock_shift`); the master is SIGKILLed
and Sentinel promotes the replica, so the store's ``TIME`` jumps by 30 s under
the running fleet.

Checked, in both directions:

- no slot is published twice;
- every replica logs the jump exactly once ("the clock of store ... jumped"): a
  replica samples the store's clock on every acquire and renewal, leading or
  not, so each of the three saw the old clock, then sees the new one. When the
  clock went back, a replica whose schedule ran on both sides of the jump in
  one term also says "the store's clock went back", at most once; a new term
  (the lease moved, or was won again) starts without a previous tick to
  compare with, so that line is not promised;
- every replica also warns once that its own clock is 30 s off the store's
  (more than ``leader_max_clock_skew``): it cannot tell which side moved;
- dispatch resumes on the new clock, with the slots after that published within
  -1 s ... +3 s of their due time by the new clock.

What the jump costs, and what the test bounds: 30 s *back*, the last slot sent
is due 30 s ahead of the new clock, and since no slot is sent twice the entry
waits for the new clock to pass it: a silence of the jump plus at most one
period and the fail-over. 30 s *ahead*, the 30 s skipped are missed slots, and
the default ``leader_missed_slots = "once"`` sends one of them at once; the
silence is the fail-over's alone.

With ``leader_clock = "local"`` the same fail-over (30 s ahead) stops the fleet:
every replica finds its own clock off the store's by more than
``leader_max_clock_skew`` and none leads; the docs warn about it.

Run with ``-s`` to see the numbers.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from harness.procs import Proc, Procs
from harness.redis_replicas import ReplicatedRedis
from harness.waiting import wait_for
from tests.test_beat_chaos import (
    BEAT,
    TTL,
    BrokerTap,
    Holder,
    Publish,
    Replicas,
    beat_env,
    beat_holder,  # noqa: F401 - a fixture
    broker,  # noqa: F401 - a fixture (tap's)
    slot_problems,
    steady,
    tap,  # noqa: F401 - a fixture
)

pytestmark = [pytest.mark.slow, pytest.mark.paced]

#: How far the replica's clock is off the master's.
SHIFT = 30.0
EVERY = 1.0
#: From the master's death to the first slot on the new clock, beyond what the
#: jump itself costs: Sentinel's promotion (its down-after is 0.5 s) and a
#: hand-over if the lease moves meanwhile (ttl + 0.5 s), plus the period.
FAILOVER = 5.0 + TTL + 0.5 + EVERY
#: Slots published after the resume, by the new clock: this early at most ...
EARLY = 1.0
#: ... and this late (what the fleet-skew test allows, a hand-over included).
LATE = 3.0
JUMPED = r"the clock of store \S+ jumped"
WENT_BACK = r"the store's clock went back"
SKEWED = r"this host's clock is [-+]30\.0 s off .* more than leader_max_clock_skew"


def _due(publish: Publish) -> float:
    assert publish.slot is not None
    return datetime.fromisoformat(publish.slot.partition("@")[2]).timestamp()


def _said(proc: Proc, pattern: str) -> int:
    return sum(re.search(pattern, line) is not None for line in proc.lines())


def _each_says(beats: Replicas, pattern: str, what: str) -> None:
    for proc in beats.current:
        wait_for(
            lambda proc=proc: _said(proc, pattern) >= 1,  # type: ignore[misc]
            TTL + 5,
            interval=0.05,
            message=lambda proc=proc: f"{proc} never said {what}",  # type: ignore[misc]
        )


def _fail_over(
    shift: float,
    clock: str,
    redis_url: str,
    beat_holder: Callable[[str], Holder],  # noqa: F811
    procs: Procs,
    tap: BrokerTap,  # noqa: F811
    tmp_path: Path,
    after: Callable[[Replicas, Holder, float], None],
) -> tuple[Replicas, float, float]:
    """Three beats on ``leader_clock = clock``, steady; the master SIGKILLed and the
    replica ``shift`` s off promoted; then ``after(beats, holder, promoted)`` while
    the store still runs. Returns the beats and when the master died and the
    replica was promoted (``time.monotonic()``)."""
    with ReplicatedRedis(replica_clock_shift=shift) as store:
        url = store.sentinel_url
        env = beat_env(redis_url, BEAT_EVERY=f"{EVERY:g}", CELERY_LEADER_CLOCK=clock)
        holder = beat_holder(url)
        beats = Replicas(procs, tmp_path, BEAT, env, [url] * 3, holder)
        beats.start()
        steady(tap, 3)
        killed = time.monotonic()
        store.master.kill()
        store.wait_promoted()
        promoted = time.monotonic()
        after(beats, holder, promoted)
    return beats, killed, promoted


@pytest.mark.parametrize("shift", [-SHIFT, SHIFT], ids=["30 s back", "30 s ahead"])
def test_a_sentinel_failover_to_a_replica_with_a_skewed_clock_sends_no_slot_twice(
    shift: float,
    redis_url: str,
    beat_holder: Callable[[str], Holder],  # noqa: F811
    procs: Procs,
    tap: BrokerTap,  # noqa: F811
    tmp_path: Path,
) -> None:
    # The wall clock of the test, whose host is the master's: for reading the
    # tap's monotonic arrival times as wall times.
    wall = time.time() - time.monotonic()

    def resumes(beats: Replicas, holder: Holder, promoted: float) -> None:
        resume_by = promoted + max(-shift, 0.0) + FAILOVER
        wait_for(
            lambda: len(tap.after(promoted)) >= 1,
            resume_by - time.monotonic() + 5,
            interval=0.05,
            message="dispatch did not resume on the promoted replica",
        )
        steady(tap, 4)
        _each_says(beats, JUMPED, "that the store's clock jumped")

    beats, killed, promoted = _fail_over(
        shift, "store", redis_url, beat_holder, procs, tap, tmp_path, resumes
    )

    published = tap.published()
    before = [p for p in published if p.seen <= killed]
    after = [p for p in published if p.seen > promoted]
    silence = after[0].seen - before[-1].seen
    # After the first slot on the new clock (under "once", a missed slot sent late).
    lateness = [p.seen + wall + shift - _due(p) for p in after[1:]]
    jumps = [_said(p, JUMPED) for p in beats.current]
    skewed = [_said(p, SKEWED) for p in beats.current]
    back = [_said(p, WENT_BACK) for p in beats.current]
    print(
        f"\nstore clock {shift:+g} s at a Sentinel fail-over: promoted "
        f"{promoted - killed:.2f} s after the kill; silence {silence:.2f} s; first slot "
        f"after it due {_due(after[0]) - _due(before[-1]):+.1f} s after the last one before; "
        f"then published {min(lateness):+.2f} ... {max(lateness):+.2f} s from due (new clock); "
        f"'jumped' said {jumps}, 'went back' said {back}; {len(published)} published"
    )
    problems = slot_problems(published, EVERY)
    assert not problems, "\n".join(problems)
    assert jumps == [1, 1, 1], [p.output()[-3000:] for p in beats.current]
    # Each also blames its own clock, once: it cannot tell which side moved.
    assert skewed == [1, 1, 1], skewed
    if shift < 0:
        assert max(back) <= 1, back
        # The price of "no slot twice": the entry waits until the new clock passes
        # its last slot.
        assert -shift - EVERY <= silence <= -shift + FAILOVER, silence
    else:
        assert back == [0, 0, 0], back
        assert silence <= FAILOVER, silence
        # The 30 s the clock skipped are missed slots: "once" sends at most one of them.
        skipped = [p.slot for p in after if _due(p) < _due(before[-1]) + SHIFT]
        assert len(skipped) <= 1, skipped
    assert min(lateness) >= -EARLY, sorted(lateness)[:5]
    assert max(lateness) <= LATE, sorted(lateness)[-5:]


def test_on_local_clocks_a_failover_to_a_store_whose_clock_is_off_stops_every_replica(
    redis_url: str,
    beat_holder: Callable[[str], Holder],  # noqa: F811
    procs: Procs,
    tap: BrokerTap,  # noqa: F811
    tmp_path: Path,
) -> None:
    """With ``leader_clock = "local"`` every replica finds its clock 30 s off the
    store's, more than ``leader_max_clock_skew``, so none leads: pinned here
    because the docs warn about it."""

    def nobody_leads(beats: Replicas, holder: Holder, promoted: float) -> None:
        _each_says(beats, SKEWED, "that its clock is off the store's")
        # Three ttls after the last of them: long enough for any replica to win
        # a free term and for a winner to publish its first slot.
        quiet = time.monotonic()
        time.sleep(3 * TTL)
        assert tap.after(quiet) == [], tap.after(quiet)

    beats, _, _ = _fail_over(
        SHIFT, "local", redis_url, beat_holder, procs, tap, tmp_path, nobody_leads
    )
    for proc in beats.current:
        assert _said(proc, JUMPED) == 1, proc.output()[-3000:]
        assert 'leader_clock "local"' in proc.output()
