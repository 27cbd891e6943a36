"""A master fail-over in a Redis Cluster of 3 masters + 3 replicas, with real schedulers.

Three ``celery beat`` replicas (and, separately, three standalone Dramatiq
schedulers) lead through a ``?cluster=true`` URL. The replica of the master
that serves the election's hash slot is made unsafe to promote, in one of two
ways, for :data:`FAULT` s:

* ``lag``: the replica is stopped (SIGSTOP) and 80 MB are written behind it;
  its link stays open, so the master still lists it online;
* ``cut``: its link is closed (``CLIENT KILL TYPE replica``) and it cannot
  reconnect, so the master lists no replica; the replica itself keeps running.

Then the master and the leading scheduler are SIGKILLed together and the
replica is promoted with ``CLUSTER FAILOVER TAKEOVER``. Checked: another
scheduler dispatches within :data:`DISPATCH` of the kill, a SIGKILL of that new
leader is handed over within :data:`HANDOVER`, and no slot is sent twice: with
the default ``leader_replica_acks``, claims are refused while the replica lags
or is cut off, so nothing goes out then; with ``0``, the cut costs slots sent
twice. Run with ``-s`` for the numbers.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from celery_leader.backends import HolderInfo, open_store
from celery_leader.exceptions import StoreUnavailable
from celery_leader.settings.config import LeaderConfig
from harness.procs import Proc, Procs
from harness.procs import signal as send_signal
from harness.redis_cluster import Cluster3x3
from harness.servers import RedisServer
from harness.waiting import wait_for
from tests.test_beat_chaos import (
    BEAT,
    BrokerTap,
    Holder,
    beat_env,
    beat_holder,  # noqa: F401 - a fixture
    broker,  # noqa: F401 - a fixture (tap's)
    hold_fault_until,
    slot_problems,
    tap,  # noqa: F401 - a fixture
)
from tests.test_beat_chaos import Replicas as Beats
from tests.test_beat_chaos import steady as beat_steady
from tests.test_dramatiq_chaos import TTL, Replicas, replica_of
from tests.test_dramatiq_chaos import Tap as DramatiqTap
from tests.test_dramatiq_chaos import steady as dramatiq_steady

pytestmark = [pytest.mark.slow, pytest.mark.timing]

#: How long the replica lags, or stays cut off, before the master dies: beat
#: tries to claim several slots meanwhile.
FAULT = 1.0
LAG_MB = 80
#: From the kill of the master and the leader to another scheduler's first
#: dispatch: promotion, the followers' next try (at most one renew_interval,
#: ttl / 3, after their store call failed), the refreshed slot map, the acquire.
DISPATCH = 5.0
#: From the kill of the new leader to the next one's first dispatch: presence
#: (0.15 s), beat's look at its lease (0.1 s), one period (0.2 s), and slack.
HANDOVER = 1.0
#: A slot claimed (and acknowledged) just before the fault reaches the broker
#: within this; later ones during the fault must have been refused.
IN_FLIGHT = 0.3
#: Beat's entries: one sends every missed slot after a fail-over, which is what
#: sends a slot twice when the promoted replica lacks its claim; one sends the last.
POLICIES = "all,once"
#: The election's lock key (default key prefix and election): its hash slot picks
#: the master that fails.
LOCK = "{celery_leader:beat}:lock"


@dataclass(frozen=True)
class Arrival:
    seen: float
    slot: str
    epoch: int


@dataclass
class Outcome:
    dispatch: float  # kill of master + leader -> first dispatch of another term
    handover: float  # kill of the next leader -> first dispatch of the next term
    twice: int  # slots sent more than once
    during_fault: int  # slots sent while the replica lagged or was cut off


@pytest.fixture
def cluster() -> Iterator[Cluster3x3]:
    store = Cluster3x3()
    try:
        store.start()
        yield store
    finally:
        store.close()


def fail_over(
    title: str,
    cluster: Cluster3x3,
    fault: str,
    arrivals: Callable[[], list[Arrival]],
    leader: Callable[[int], tuple[int, Callable[[], None]]],
    steady: Callable[[], None],
) -> Outcome:
    """The scenario of the module docstring, once. ``leader(newer_than)`` waits for
    a holder with a larger epoch and returns its epoch and how to SIGKILL it."""
    steady()
    epoch, kill_leader = leader(0)
    master = cluster.master_of(LOCK)
    replica = cluster.replica_of(master)
    cluster.wait_synced(master)

    if fault == "lag":
        replica.pause()
        began = time.monotonic()
        cluster.write_behind(master, LOCK, LAG_MB)
    else:
        cluster.cut_replica_link(master, replica)
        began = time.monotonic()
    hold_fault_until(began + FAULT)
    kill_leader()
    master.kill()
    killed = time.monotonic()
    if replica.paused:
        replica.resume()
    cluster.take_over(replica)
    promoted = time.monotonic()

    def after(moment: float, older: int) -> Arrival | None:
        return next((a for a in arrivals() if a.seen > moment and a.epoch > older), None)

    first = wait_for(lambda: after(killed, epoch), DISPATCH + 10, interval=0.02, message="dispatch")
    steady()
    second_epoch, kill_second = leader(epoch)
    kill_second()
    killed_again = time.monotonic()
    second = wait_for(
        lambda: after(killed_again, second_epoch), HANDOVER + 10, interval=0.02, message="hand-over"
    )
    steady()
    sent = arrivals()
    slots = [a.slot for a in sent]
    outcome = Outcome(
        dispatch=first.seen - killed,
        handover=second.seen - killed_again,
        twice=len(slots) - len(set(slots)),
        during_fault=sum(began + IN_FLIGHT < a.seen <= killed for a in sent),
    )
    print(
        f"\nFAILOVER {title}: promoted {promoted - killed:.2f} s after the kill; first dispatch "
        f"{outcome.dispatch:.2f} s after the kill; next hand-over {outcome.handover:.2f} s; "
        f"{outcome.during_fault} sent during the fault (after {IN_FLIGHT:g} s); "
        f"{len(sent)} sent, {outcome.twice} twice"
    )
    return outcome


def _check(outcome: Outcome) -> None:
    """What the default ``leader_replica_acks`` promises: nothing sent while the replica
    lags or is cut off, nothing sent twice, and the bounds of the module docstring."""
    assert outcome.during_fault == 0, outcome
    assert outcome.twice == 0
    assert outcome.dispatch <= DISPATCH, outcome
    assert outcome.handover <= HANDOVER, outcome


@pytest.mark.parametrize(
    ("fault", "acks"),
    [("lag", "auto"), ("cut", "auto"), ("cut", "0")],
    ids=["lag", "cut", "cut, acks=0 shows the hazard"],
)
def test_three_beats_through_a_cluster_master_failover(
    fault: str,
    acks: str,
    cluster: Cluster3x3,
    redis_url: str,
    beat_holder: Callable[[str], Holder],  # noqa: F811
    procs: Procs,
    tap: BrokerTap,  # noqa: F811
    tmp_path: Path,
) -> None:
    url = cluster.url
    env = beat_env(redis_url, BEAT_POLICIES=POLICIES, CELERY_LEADER_REPLICA_ACKS=acks)
    beats = Beats(procs, tmp_path, BEAT, env, [url] * 3, beat_holder(url))
    beats.start()

    def arrivals() -> list[Arrival]:
        return [
            Arrival(p.seen, p.slot, p.epoch)
            for p in tap.published()
            if p.slot is not None and p.epoch is not None
        ]

    def leader(newer_than: int) -> tuple[int, Callable[[], None]]:
        def newer() -> tuple[int, Proc, int] | None:
            found = beats.leader()
            return found if found[2] > newer_than else None

        _, proc, epoch = wait_for(newer, DISPATCH + 10, interval=0.05, message="a newer holder")
        return epoch, lambda: send_signal(proc, signal.SIGKILL)

    title = f"beat, {fault}, leader_replica_acks {acks}"
    outcome = fail_over(title, cluster, fault, arrivals, leader, lambda: beat_steady(tap))
    if acks == "0":
        # Proves the cut reached the replica: claims it never got are sent again.
        assert outcome.twice > 0, outcome
        return
    assert not slot_problems(tap.published())
    _check(outcome)


@pytest.fixture
def dramatiq_broker() -> Iterator[tuple[str, DramatiqTap]]:
    """A Redis broker of its own and a tap on its queue."""
    with RedisServer() as server:
        client = server.client()
        tap = DramatiqTap(client)
        yield server.url, tap
        tap.close()
        client.close()


@pytest.mark.parametrize("fault", ["lag", "cut"])
def test_three_dramatiq_schedulers_through_a_cluster_master_failover(
    fault: str, cluster: Cluster3x3, dramatiq_broker: tuple[str, DramatiqTap], procs: Procs
) -> None:
    broker_url, dtap = dramatiq_broker
    url = cluster.url
    env = {"BROKER_URL": broker_url, "LEADER_URL": url, "LEADER_TTL": str(TTL)}
    config = LeaderConfig.from_env(env={}, leader_url=url, leader_ttl=TTL)
    replicas = Replicas(procs, env, embedded=False)
    replicas.start()
    store = open_store(config)

    def arrivals() -> list[Arrival]:
        return [Arrival(s.seen, s.slot, s.epoch) for s in dtap.sent()]

    def leader(newer_than: int) -> tuple[int, Callable[[], None]]:
        def newer() -> HolderInfo | None:
            try:
                holder = store.lock.holder(config.beat_election)
            except StoreUnavailable:
                return None
            return holder if holder is not None and holder.epoch > newer_than else None

        holder = wait_for(newer, DISPATCH + 10, interval=0.05, message="a newer leader")
        proc = replica_of(replicas, int(holder.instance_id.rpartition(":")[2]))
        return holder.epoch, lambda: os.killpg(proc.pid, signal.SIGKILL)

    try:
        title = f"dramatiq, {fault}, leader_replica_acks auto"
        outcome = fail_over(title, cluster, fault, arrivals, leader, lambda: dramatiq_steady(dtap))
    finally:
        store.close()
    _check(outcome)
