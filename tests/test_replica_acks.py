"""Claims and epochs survive a promotion of the Redis replica (leader_replica_acks).

A master and a replica whose replication link runs through a proxy the test
holds: the master keeps accepting writes the replica never gets. Then the master
dies and the replica is promoted (``REPLICAOF NO ONE``, what Sentinel sends).
With ``leader_replica_acks = 0`` this loses an accepted claim and hands out an
epoch twice: the hazard, shown. With the default (``auto``) the claim and the
term are refused while the replica is cut off, and what was accepted before
survives: epochs keep growing.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from celery_leader.backends import Fence, Renewal, StoreFacets, Write, open_store
from celery_leader.backends.postgres.sql import sync_standbys
from celery_leader.exceptions import ConfigError, StoreUnavailable
from celery_leader.settings.config import LeaderConfig
from harness.pg_standby import PrimaryAndStandby
from harness.redis_replicas import ReplicatedRedis
from harness.waiting import wait_for

# The default ttl. Its store deadline (the renew interval, ttl / 3 = 5 s) halves into
# the window a write waits for its replicas' acknowledgements: 2.5 s. A replica on
# loopback acknowledges in milliseconds, but in one clean-clone run, beside two busy
# test streams, none came within the 0.5 s that ttl 3 gave ("(0 acknowledged)"). Each
# refused write waits the whole window: five tests here do, once each.
TTL = 15.0


@pytest.fixture
def replicated() -> Iterator[ReplicatedRedis]:
    store = ReplicatedRedis()
    try:
        store.start(sentinels=False)
        yield store
    finally:
        store.close()


def _backend(url: str, acks: object) -> StoreFacets:
    config = LeaderConfig.from_mapping(
        {"leader_url": url, "leader_ttl": TTL, "leader_replica_acks": acks}
    )
    return open_store(config)


def _promote(store: ReplicatedRedis) -> StoreFacets:
    """Kill the master, promote the replica; a backend on the new master (auto acks)."""
    assert store.link is not None
    store.master.kill()
    with store.replica.client() as client:
        client.execute_command("REPLICAOF", "NO", "ONE")
    store.link.release()
    return _backend(store.replica.url, None)


@pytest.mark.parametrize("acks", [0, None], ids=["acks=0", "acks=auto"])
def test_a_promotion_keeps_claims_and_epochs_only_with_replica_acks(
    replicated: ReplicatedRedis, acks: int | None
) -> None:
    assert replicated.link is not None
    backend = _backend(replicated.master.url, acks)
    try:
        first = backend.lock.acquire("e", "a", TTL, 0).term
        assert first is not None
        assert backend.records.claim(Fence("e", first), [Write("tick", None, "slot-1")]) == [True]
        backend.lock.release("e", first)
        replicated.wait_synced()
        replicated.link.hold()  # the replica hears nothing more from the master
        try:
            second = backend.lock.acquire("e", "b", TTL, 0).term
        except StoreUnavailable as exc:
            assert acks is None, exc
            assert "replica" in str(exc) and "\n" not in str(exc)
            assert backend.lock.holder("e") is None, "a refused term is released"
            second = None
        if second is not None:
            assert acks == 0
            assert second.epoch > first.epoch
            # Accepted by the master alone.
            assert backend.records.claim(
                Fence("e", second), [Write("tick", "slot-1", "slot-2")]
            ) == [True]
        promoted = _promote(replicated)
    finally:
        backend.close()
    try:
        third = promoted.lock.acquire("e", "c", TTL, 0).term
        assert third is not None
        stored = promoted.records.load("e")
        if acks == 0:
            # The hazard: the claim is gone, and the lost term's epoch comes again.
            assert second is not None
            assert stored == {"tick": "slot-1"}
            assert third.epoch == second.epoch
        else:
            assert stored == {"tick": "slot-1"}
            assert third.epoch > first.epoch
    finally:
        promoted.close()


def test_an_unacknowledged_claim_is_handed_back_and_raises(
    replicated: ReplicatedRedis,
) -> None:
    """The master survives: the state is what it was before the refused claims."""
    assert replicated.link is not None
    backend = _backend(replicated.master.url, None)
    try:
        term = backend.lock.acquire("e", "a", TTL, 0).term
        assert term is not None
        assert backend.records.claim(Fence("e", term), [Write("x", None, "1")]) == [True]
        replicated.link.hold()
        claims = [Write("x", "1", "2"), Write("y", None, "1"), Write("z", "other", "1")]
        with pytest.raises(StoreUnavailable, match="handed back"):
            backend.records.claim(Fence("e", term), claims)
        assert backend.records.load("e") == {"x": "1"}
        replicated.link.release()
        assert backend.records.claim(Fence("e", term), claims) == [True, True, False]
        assert backend.records.load("e") == {"x": "2", "y": "1"}
    finally:
        backend.close()


def test_a_number_of_acks_more_than_the_replicas_refuses_every_claim(
    replicated: ReplicatedRedis,
) -> None:
    backend = _backend(replicated.master.url, 2)
    try:
        with pytest.raises(StoreUnavailable, match=r"not on 2 replica\(s\).*\(1 acknowledged\)"):
            backend.lock.acquire("e", "a", TTL, 0)
    finally:
        backend.close()


@pytest.mark.parametrize("value", [-1, 1.5, "some", True, [1]])
def test_bad_replica_acks_fail_in_one_line_naming_the_setting(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        LeaderConfig.from_mapping({"leader_url": "memory://", "leader_replica_acks": value})
    assert str(info.value).startswith("leader_replica_acks must be 'auto' or a whole number")


@pytest.mark.parametrize(
    ("value", "parsed"), [(None, None), ("auto", None), ("AUTO", None), (0, 0), ("2", 2), (3.0, 3)]
)
def test_replica_acks_values(value: object, parsed: int | None) -> None:
    config = LeaderConfig.from_mapping({"leader_url": "memory://", "leader_replica_acks": value})
    assert config.replica_acks == parsed


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("names", "waits_for"),
    [
        ("", 0),
        ("  ", 0),
        ("standby1", 1),
        ("s1, s2", 1),
        ("*", 1),
        ("2 (s1, s2, s3)", 2),
        ("FIRST 2 (s1, s2)", 2),
        ("first 3 (s1, s2, s3)", 3),
        ("ANY 1 (s1, s2)", 1),
        (" any  2(s1, s2)", 2),
        ('"first" ', 1),
    ],
)
def test_postgres_reads_how_many_standbys_a_commit_waits_for(
    postgres_url: str, names: str, waits_for: int
) -> None:
    """The parse of synchronous_standby_names that the claim statement does."""
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(f"SELECT {sync_standbys('%(names)s::text')}", {"names": names})
        assert row.fetchone() == (waits_for,)


@pytest.mark.slow
def test_behind_sentinel_auto_waits_for_a_cut_off_replica_sentinel_could_promote() -> None:
    """The replica's link is cut: the master lists no replica, but Sentinel may promote it.

    Through a plain URL to the master, ``auto`` sees no replica and the claim
    is accepted by the master alone; after the promotion it is gone. Through
    the Sentinel URL the claim waits for the replica Sentinel could promote,
    is refused, and nothing is lost or sent on it.
    """
    store = ReplicatedRedis()
    try:
        store.start()
        assert store.link is not None
        plain = _backend(store.master.url, None)
        guarded = _backend(store.sentinel_url, None)
        try:
            terms = {
                b: b.lock.acquire(e, "a", TTL, 0).term for b, e in ((plain, "p"), (guarded, "s"))
            }
            store.wait_synced()
            store.link.hold()
            store.link.cut()  # the replica reconnects to a proxy that forwards nothing
            wait_for(lambda: store.online_replicas() == 0, 10, message="replica still online")
            term = terms[plain]
            assert term is not None
            assert plain.records.claim(Fence("p", term), [Write("tick", None, "slot-1")]) == [True]
            term = terms[guarded]
            assert term is not None
            with pytest.raises(StoreUnavailable, match="handed back"):
                guarded.records.claim(Fence("s", term), [Write("tick", None, "slot-1")])
        finally:
            plain.close()
            guarded.close()
        store.master.kill()
        store.wait_promoted()
        promoted = _backend(store.replica.url, None)
        try:
            assert promoted.records.load("p") == {}, "the master alone had the claim"
            assert promoted.records.load("s") == {}
        finally:
            promoted.close()
    finally:
        store.close()


@pytest.mark.postgres
def test_a_postgres_claim_the_synchronous_standby_does_not_confirm_is_handed_back() -> None:
    """The standby stalls, the primary survives: nothing is lost, the leader keeps its term."""
    store = PrimaryAndStandby(synchronous=True)
    try:
        store.start()
        leader = _backend(store.url, None)
        other = _backend(store.url, None)
        try:
            term = leader.lock.acquire("e", "a", TTL, 0).term
            assert term is not None
            assert leader.records.claim(Fence("e", term), [Write("x", None, "1")]) == [True]
            store.link.hold()
            claims = [Write("x", "1", "2"), Write("y", None, "1")]
            with pytest.raises(StoreUnavailable, match=r"2 claim.*handed back"):
                leader.records.claim(Fence("e", term), claims)
            assert leader.records.load("e") == {"x": "1"}
            assert leader.lock.renew("e", term, TTL)[0] is Renewal.RENEWED
            assert other.lock.acquire("e", "b", TTL, 0).term is None
            store.link.release()
            assert leader.records.claim(Fence("e", term), claims) == [True, True]
            assert leader.records.load("e") == {"x": "2", "y": "1"}
        finally:
            leader.close()
            other.close()
    finally:
        store.close()
