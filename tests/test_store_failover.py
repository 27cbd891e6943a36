"""A fail-over of the lease store itself: no slot sent twice, no epoch reused.

Two real ``celery beat`` replicas on a replicated store, an entry every 0.2 s
with ``leader_missed_slots = "all"`` and one with ``"once"``. Replication to
the standby stalls for 2 s (its link is held by a TCP proxy, so the primary
keeps accepting writes the standby never gets), then the primary is killed,
with or without the leading beat, and the standby is promoted. Without claims
that wait for the standby the next leader reads older state from it and sends
again the slots the old primary had already accepted: measured at 10 slots
sent twice on Redis Sentinel before ``leader_replica_acks``.

Checked: no slot published twice, no epoch published by two processes, epochs
never go back, dispatch resumes after the promotion. Run with ``-s`` for the
numbers.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from celery_leader.backends import Fence, Write, open_store
from celery_leader.exceptions import StoreMisconfigured
from celery_leader.settings.config import LeaderConfig
from harness.pg_standby import PrimaryAndStandby
from harness.procs import Procs
from harness.procs import signal as send_signal
from harness.proxy import TcpProxy
from harness.redis_replicas import ReplicatedRedis
from harness.waiting import wait_for
from tests.test_beat_chaos import (
    BEAT,
    FAILOVER,
    TTL,
    BrokerTap,
    Holder,
    Publish,
    Replicas,
    beat_env,
    beat_holder,  # noqa: F401 - a fixture
    broker,  # noqa: F401 - a fixture (tap's)
    hold_fault_until,
    slot_problems,
    steady,
    tap,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.slow

#: How long replication stays stalled before the primary dies.
STALL = 2.0
POLICIES = "all,once"


@dataclass
class Failover:
    """Moments of one fail-over, ``time.monotonic()``."""

    stalled: float
    killed: float
    promoted: float


def epoch_problems(published: list[Publish]) -> list[str]:
    """An epoch sent by two processes was handed out twice; epochs never go back."""
    by_epoch: dict[int, set[int]] = {}
    for p in published:
        if p.epoch is not None:
            by_epoch.setdefault(p.epoch, set()).add(p.pid)
    problems = [
        f"epoch {e} used by processes {sorted(pids)}"
        for e, pids in by_epoch.items()
        if len(pids) > 1
    ]
    epochs = [p.epoch for p in published if p.epoch is not None]
    back = [(a, b) for a, b in pairwise(epochs) if b < a]
    if back:
        problems.append(f"epochs went back: {back[:5]}")
    return problems


def report(title: str, published: list[Publish], at: Failover) -> None:
    stall = [p for p in published if at.stalled < p.seen <= at.killed]
    after = [p for p in published if p.seen > at.promoted]
    first = min((p.seen for p in after), default=float("nan"))
    print(
        f"\n{title}: promotion {at.promoted - at.killed:.2f} s after the kill; "
        f"{len(stall)} slot(s) sent during the {STALL:g} s stall; first publish "
        f"{first - at.promoted:.2f} s after the promotion; "
        f"{len(published)} published, "
        f"{len(published) - len({p.slot for p in published})} sent twice"
    )


def fail_over(
    beats: Replicas,
    tap: BrokerTap,  # noqa: F811
    link: TcpProxy,
    kill_primary: Callable[[], None],
    promote: Callable[[], None],
    kill_leader: bool,
) -> Failover:
    """Start ``beats``, stall replication for :data:`STALL` s, kill the primary
    (and the leading beat if ``kill_leader``), promote the standby, and wait
    until dispatch resumes from it.

    The same sequence for every store; ``link`` is the standby's replication
    link, ``kill_primary`` and ``promote`` the store's own ways to do each.
    """
    beats.start()
    steady(tap)
    _, leader, _ = beats.leader()

    stalled = time.monotonic()
    link.hold()
    hold_fault_until(stalled + STALL)
    if kill_leader:
        send_signal(leader, signal.SIGKILL)
    kill_primary()
    killed = time.monotonic()
    promote()
    at = Failover(stalled, killed, time.monotonic())
    link.release()

    # Both entries, each at least twice, from the new primary.
    wait_for(
        lambda: len(tap.after(at.promoted)) >= 4,
        FAILOVER + 10,
        interval=0.02,
        message="dispatch did not resume after the promotion",
    )
    steady(tap)
    return at


@pytest.fixture
def sentinel_store() -> Iterator[ReplicatedRedis]:
    with ReplicatedRedis() as store:
        yield store


@pytest.mark.parametrize(
    ("kill_leader", "acks"),
    [(False, "auto"), (True, "auto"), (False, "0")],
    ids=["leader survives", "leader killed", "acks=0 shows the hazard"],
)
def test_sentinel_failover_after_stalled_replication_sends_no_slot_twice(
    kill_leader: bool,
    acks: str,
    sentinel_store: ReplicatedRedis,
    redis_url: str,
    beat_holder: Callable[[str], Holder],  # noqa: F811
    procs: Procs,
    tap: BrokerTap,  # noqa: F811
    tmp_path: Path,
) -> None:
    store = sentinel_store
    assert store.link is not None
    url = store.sentinel_url
    beats = Replicas(
        procs,
        tmp_path,
        BEAT,
        beat_env(redis_url, BEAT_POLICIES=POLICIES, CELERY_LEADER_REPLICA_ACKS=acks),
        [url, url],
        beat_holder(url),
    )
    at = fail_over(beats, tap, store.link, store.master.kill, store.wait_promoted, kill_leader)
    published = tap.published()
    who = "leader killed" if kill_leader else "leader survives"
    report(f"Sentinel fail-over, {who}, leader_replica_acks {acks}", published, at)
    problems = slot_problems(published) + epoch_problems(published)
    if acks == "0":
        # Proves the stall reached the replica: without waiting for it, slots come twice.
        assert any("more than once" in p for p in problems), problems
    else:
        assert not problems, "\n".join(problems)


# -- PostgreSQL: a primary and a standby promoted with pg_promote() ------------------


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("kill_leader", "synchronous"),
    [(False, True), (True, True), (False, False)],
    ids=["leader survives", "leader killed", "asynchronous standby, acks=0, shows the hazard"],
)
def test_postgres_failover_after_stalled_replication_sends_no_slot_twice(
    kill_leader: bool,
    synchronous: bool,
    redis_url: str,
    beat_holder: Callable[[str], Holder],  # noqa: F811
    procs: Procs,
    tap: BrokerTap,  # noqa: F811
    tmp_path: Path,
) -> None:
    store = PrimaryAndStandby(synchronous)
    try:
        store.start()
        acks = "auto" if synchronous else "0"
        beats = Replicas(
            procs,
            tmp_path,
            BEAT,
            beat_env(redis_url, BEAT_POLICIES=POLICIES, CELERY_LEADER_REPLICA_ACKS=acks),
            [store.url, store.url],
            beat_holder(store.url),
        )
        at = fail_over(beats, tap, store.link, store.primary.kill, store.promote, kill_leader)
    finally:
        store.close()
    published = tap.published()
    who = "leader killed" if kill_leader else "leader survives"
    kind = "synchronous" if synchronous else "asynchronous"
    report(f"PostgreSQL fail-over, {kind} standby, {who}, acks {acks}", published, at)
    problems = slot_problems(published) + epoch_problems(published)
    if not synchronous:
        assert any("more than once" in p for p in problems), problems
    else:
        assert not problems, "\n".join(problems)


@pytest.mark.postgres
def test_postgres_with_an_asynchronous_standby_refuses_claims_by_default() -> None:
    store = PrimaryAndStandby(synchronous=False)
    try:
        store.start()
        config = LeaderConfig.from_mapping({"leader_url": store.url, "leader_ttl": TTL})
        opened = open_store(config)
        try:
            term = opened.lock.acquire("beat", "r0", TTL, 0).term
            assert term is not None
            with pytest.raises(StoreMisconfigured) as info:
                opened.records.claim(Fence("beat", term), [Write("tick", None, "1")])
            assert opened.records.load("beat") == {}
        finally:
            opened.close()
    finally:
        store.close()
    message = str(info.value)
    assert "\n" not in message
    assert "leader_replica_acks" in message and "synchronous_standby_names" in message
    assert "0 synchronous standby(s) (1 connected)" in message
