"""Presence on Redis: a holder whose connection closed is replaced without waiting for its ttl.

Lease processes (``tests/apps/lease_proc.py``) at the default ttl of 15 s, so
that a hand-over that waited for the ttl could not pass. A paused or
partitioned holder keeps its connection open and so keeps the ttl bound
(``tests/test_lease_redis.py``). A server that refuses the commands falls
back to the ttl, saying so once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from celery_leader.backends import StoreParams
from celery_leader.backends.redis import open_store
from celery_leader.backends.redis.presence import _FALLBACKS, WATCH_INTERVAL
from harness.procs import Procs
from harness.proxy import TcpProxy
from harness.servers import RedisServer
from tests.apps.lease_cluster import LeaseCluster, stats

TTL = 15.0
STARTUP = 20.0  # a cold Python + celery import on a busy 2-core machine
#: A dead holder is found at the designated successor's next check; the rest is
#: one round trip and a busy machine's scheduling.
CRASH = WATCH_INTERVAL + 0.3
#: A live holder whose connection Redis closed stops believing by itself this fast.
NOTICE = 0.1


@pytest.fixture
def cluster(procs: Procs, tmp_path: Path, redis_url: str) -> Iterator[LeaseCluster]:
    # One follow is settled: the first acquire subscribes before it is sent.
    made = LeaseCluster(procs, tmp_path, redis_url, ttl=TTL, settle_follows=1)
    yield made
    made.close()


@pytest.mark.slow
@pytest.mark.timing
def test_sigkill_of_the_holder_hands_over_without_waiting_for_the_ttl(
    cluster: LeaseCluster,
) -> None:
    leader = cluster.spawn(0)
    assert cluster.wait_leader(STARTUP) is leader
    for slot in (1, 2):
        cluster.wait_settled(cluster.spawn(slot), 0.0, STARTUP)
    with cluster.sampling() as samples:
        handovers = cluster.hand_overs(leader, cluster.kill, 3, TTL, STARTUP)
    print(f"\nHANDOVER redis SIGKILL (ttl {TTL:g} s, presence): {stats(handovers)}")
    assert max(handovers) <= CRASH
    assert not samples.several()
    cluster.check_terms()


@pytest.mark.timing  # stops believing within 0.1 s
def test_a_live_holder_whose_connection_is_reset_stops_at_once_and_hands_over(
    cluster: LeaseCluster,
    redis_server: RedisServer,
    redis_url: str,
    tcp_proxy: Callable[[str, int], TcpProxy],
) -> None:
    proxy = tcp_proxy("127.0.0.1", redis_server.port)
    a = cluster.spawn(0, url=proxy.url_for(redis_url))
    assert cluster.wait_leader(STARTUP) is a
    b = cluster.spawn(1)
    cluster.wait_settled(b, 0.0, STARTUP)

    cut = time.monotonic()
    proxy.cut()  # both ends see their socket close; the process lives on
    noticed = a.wait_event("disconnected", 2, after=cut)
    term = cluster.wait_term_after(cut, 1.0, other_than=a)
    old = [t for t in cluster.terms() if t.member is a][-1]
    print(
        f"\nRESET: a noticed after {(noticed['t'] - cut) * 1000:.1f} ms, its belief ended "
        f"{(old.end - cut) * 1000:.1f} ms after the cut; b's term {term.start - cut:.3f} s after"
    )
    assert term.member is b and term.start - cut <= 1.0
    assert old.end - cut <= NOTICE, "the old holder stopped believing at once"
    assert term.epoch > old.epoch
    # It rejoins (through the proxy, which accepts new connections) as a follower.
    a.wait_event("follow", cluster.renew + 2, after=cut, holder_id=b.ident)
    assert cluster.leader() is b


@pytest.fixture
def refusing_url(request: pytest.FixtureRequest, redis_url: str) -> Iterator[str]:
    """A Redis URL whose server refuses ``PUBSUB``: by ACL (that command, or every
    pub/sub command), or renamed away."""
    _FALLBACKS.clear()  # each case may say it once more
    if request.param in ("acl", "acl-all-pubsub"):
        refused = "-pubsub" if request.param == "acl" else "-@pubsub"
        with redis.Redis.from_url(redis_url) as admin:
            admin.acl_setuser(
                "nopubsub", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                commands=["+@all", refused],
            )  # fmt: skip
            try:
                yield redis_url.replace("redis://", "redis://nopubsub:pw@")
            finally:
                admin.acl_deluser("nopubsub")
    else:
        with RedisServer("--rename-command", "PUBSUB", "pubsub-renamed") as server:
            yield server.url


@pytest.mark.parametrize("refusing_url", ["acl", "acl-all-pubsub", "renamed"], indirect=True)
def test_a_server_that_refuses_pubsub_falls_back_to_the_ttl_and_says_so_once(
    refusing_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    a, b, c = (open_store(StoreParams(refusing_url, "presence", 1.0)) for _ in range(3))
    try:
        with caplog.at_level(logging.INFO, "celery_leader.backends.redis"):
            first = a.lock.acquire("e", "a", TTL, 0)
            assert first.term is not None
            assert "presence" not in json.loads(first.term.token)
            a.close()  # its connections close without a release, as in a crash
            for backend, name in ((b, "b"), (c, "c"), (b, "b")):
                seen = backend.lock.acquire("e", name, TTL, 0)
                assert seen.term is None and seen.holder is not None
                assert seen.holder.instance_id == "a", "nobody takes over before the ttl"
                assert seen.retry_after > TTL - 1, "followers wait for the ttl, none watches"
    finally:
        for backend in (b, c):
            backend.close()
    said = [r.getMessage() for r in caplog.records if "ttl runs out" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("celery-leader: Redis at ") and "refused" in said[0]
    assert "pw@" not in said[0], "password masked"
