"""Redis Cluster with replicas (3 + 3): the store keeps working across a master fail-over.

The master that serves the election's hash slot is SIGKILLed and its replica
promoted with ``CLUSTER FAILOVER TAKEOVER``. Every store operation, on the
backend that led and on one that followed, must reach the new master within
one store call deadline of the promotion: none may keep retrying the dead node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from celery_leader.backends import Fence, StoreFacets, Write, open_store
from celery_leader.exceptions import StoreUnavailable
from celery_leader.settings.config import LeaderConfig
from harness.redis_cluster import Cluster3x3

TTL = 3.0
ELECTION = "beat"


@pytest.fixture(scope="module")
def cluster3x3() -> Iterator[Cluster3x3]:
    cluster = Cluster3x3()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def _backend(url: str, **settings: Any) -> StoreFacets:
    return open_store(LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL, **settings}))


def _until_it_works(call: Callable[[], Any], since: float, timeout: float) -> float:
    """Seconds from ``since`` until ``call`` first returns without StoreUnavailable."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            call()
            return time.monotonic() - since
        except StoreUnavailable as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"still failing {timeout:g} s on: {exc}") from exc


def test_every_operation_reaches_the_promoted_master(cluster3x3: Cluster3x3) -> None:
    """Each backend's first call after the promotion is the one measured, so that no
    call profits from a slot map another call refreshed."""
    cluster = cluster3x3
    leader, follower, watcher = (_backend(cluster.url) for _ in range(3))
    try:
        term = leader.lock.acquire(ELECTION, "leader", TTL, 0).term
        assert term is not None
        assert leader.records.claim(Fence(ELECTION, term), [Write("tick", None, "1")]) == [True]
        assert follower.lock.acquire(ELECTION, "follower", TTL, 0).term is None
        assert watcher.lock.holder(ELECTION) is not None
        lock = f"{{{leader.params.key_prefix}:{ELECTION}}}:lock"
        master = cluster.master_of(lock)
        replica = cluster.replica_of(master)
        cluster.wait_synced(master)

        master.kill()
        cluster.take_over(replica)
        promoted = time.monotonic()
        claimed: list[bool] = []
        won: list[Any] = []
        took = {
            "leader claim": _until_it_works(
                lambda: claimed.extend(
                    leader.records.claim(Fence(ELECTION, term), [Write("tick", "1", "2")])
                ),
                promoted,
                8,
            ),
            "leader renew": _until_it_works(
                lambda: leader.lock.renew(ELECTION, term, TTL), promoted, 8
            ),
            "watcher holder": _until_it_works(lambda: watcher.lock.holder(ELECTION), promoted, 8),
            # The leader's presence lived on the dead master: the follower takes over.
            "follower acquire": _until_it_works(
                lambda: won.append(follower.lock.acquire(ELECTION, "follower", TTL, 0).term),
                promoted,
                8,
            ),
        }
        print("\nafter TAKEOVER: " + ", ".join(f"{k} {v:.2f} s" for k, v in took.items()))
        # One store call deadline: the first try fails on the dead node, the retry on
        # the refreshed map reaches the new master.
        assert all(v <= leader.timeout for v in took.values()), took
        assert claimed == [True]
        assert won[0] is not None and won[0].epoch > term.epoch
        assert watcher.lock.holder(ELECTION).instance_id == "follower"
        assert follower.records.load(ELECTION) == {"tick": "2"}
    finally:
        for backend in (leader, follower, watcher):
            backend.close()


def test_calls_follow_a_slot_moved_to_another_master(cluster3x3: Cluster3x3) -> None:
    """A slot migration: the old node answers MOVED, and the claim (pinned, for WAIT)
    and the renewal reach the new owner within the store call deadline."""
    cluster = cluster3x3
    leader = _backend(cluster.url)
    election = "moved"
    try:
        term = leader.lock.acquire(election, "leader", 30, 0).term
        assert term is not None
        assert leader.records.claim(Fence(election, term), [Write("tick", None, "1")]) == [True]
        lock = f"{{{leader.params.key_prefix}:{election}}}:lock"
        source = cluster.master_of(lock)
        target = next(
            n for n in cluster.nodes if n.running and n is not source and n.role() == "master"
        )
        cluster.move_slot(lock, target)
        moved = time.monotonic()
        assert leader.records.claim(Fence(election, term), [Write("tick", "1", "2")]) == [True]
        assert leader.lock.renew(election, term, 30)[0].name == "RENEWED"
        took = time.monotonic() - moved
        print(f"\nafter the slot moved: claim and renewal {took:.2f} s")
        assert took <= leader.timeout
        assert cluster.master_of(lock) is target
        assert leader.records.load(election) == {"tick": "2"}
    finally:
        leader.close()


def test_a_replica_cut_off_during_a_term_is_waited_for_until_the_cluster_fails_it(
    cluster3x3: Cluster3x3,
) -> None:
    """With ``"auto"``, a replica the term's master had when the term began stays
    needed while the cluster lists it: claims are refused, not lost to a promotion
    of that replica. Once the cluster flags it failed, claims go through again:
    the shard is not down for ever."""
    cluster = cluster3x3
    leader = _backend(cluster.url)
    election = "cut"
    try:
        # A term that outlives the wait for the cluster to fail the replica.
        term = leader.lock.acquire(election, "leader", 30, 0).term
        assert term is not None
        assert leader.records.claim(Fence(election, term), [Write("tick", None, "1")]) == [True]
        lock = f"{{{leader.params.key_prefix}:{election}}}:lock"
        master = cluster.master_of(lock)
        replica = cluster.replica_of(master)
        cluster.cut_replica_link(master, replica)
        cut = time.monotonic()
        with pytest.raises(StoreUnavailable, match="not on 1 replica"):
            leader.records.claim(Fence(election, term), [Write("tick", "1", "2")])
        assert leader.records.load(election) == {"tick": "1"}, "handed back"
        # Still refused while the cluster lists the replica; stopped, it is flagged
        # failed after cluster-node-timeout, and claims no longer wait for it.
        replica.pause()
        try:
            cluster.wait_failed(replica, timeout=10)
            failed = time.monotonic() - cut
            assert leader.records.claim(Fence(election, term), [Write("tick", "1", "2")]) == [True]
            print(f"\nreplica cut off: claims refused until the cluster failed it, {failed:.2f} s")
        finally:
            replica.resume()
    finally:
        leader.close()
