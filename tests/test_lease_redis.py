"""Leases in real processes against a real redis-server: safety, failover, faults, cost.

Every process runs ``tests/apps/lease_proc.py`` and records its belief as it goes;
``tests/apps/lease_cluster.py`` samples those records every 10 ms and audits the
terms afterwards. Times are CLOCK_MONOTONIC (system-wide), taken by the processes
themselves. Handover = start of the follower's term - the instant just before the
signal was sent. Run with ``-s`` to see the measured numbers.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from celery_leader import LeaderConfig, Lease
from celery_leader.backends import Edit, Fence, JournalWrite, StoreParams, Write, open_store
from celery_leader.backends.redis import entries as redis_entries
from celery_leader.backends.redis import open_store as open_redis
from celery_leader.backends.redis.presence import WATCH_INTERVAL
from celery_leader.exceptions import StoreUnavailable
from harness.procs import Procs
from harness.procs import signal as send_signal
from harness.servers import RedisServer, free_port
from harness.waiting import wait_for
from tests.apps.lease_cluster import LeaseCluster, Member, describe_memory, run_chaos, stats

TTL = 2.0
RENEW = TTL / 3
STARTUP = 20.0  # a cold Python + celery import on a busy 2-core machine
LIMITS = {"kill": TTL + 0.5, "stop": TTL + 0.5, "term": 0.5}


@pytest.fixture
def cluster(procs: Procs, tmp_path: Path, redis_url: str):
    made = LeaseCluster(procs, tmp_path, redis_url, ttl=TTL, renew=RENEW)
    yield made
    made.close()


def start_pair(cluster: LeaseCluster, **urls: str) -> tuple[Member, Member]:
    """A leader in slot 0, then a follower in slot 1 that has settled into following."""
    a = cluster.spawn(0, url=urls.get("a"))
    assert cluster.wait_leader(STARTUP) is a
    b = cluster.spawn(1, url=urls.get("b"))
    cluster.wait_settled(b, 0.0, STARTUP)
    return a, b


def report(label: str, values: list[float]) -> None:
    print(f"\nHANDOVER redis {label}: {stats(values)}")


# -- exactly one leader --------------------------------------------------------------


def chaos(cluster: LeaseCluster, size: int, duration: float, faults: list[str]) -> None:
    result = run_chaos(cluster, size=size, duration=duration, faults=faults, handover_limits=LIMITS)
    print(f"\nCHAOS redis {size} processes: {result.summary()}")
    several = result.samples.several()
    assert not several, f"two leaders at once: {several[:5]}\n{cluster.describe()}"
    assert not result.no_leader_unexplained, (
        f"no leader outside any fault's allowance: {result.no_leader_unexplained[:5]}"
    )
    assert result.samples.max_gap() < 0.25, "the sampler itself stalled"
    assert {f.kind for f in result.faults} >= {"kill", "stop", "term"}
    for kind, limit in LIMITS.items():
        for value in result.handovers(kind):
            assert value <= limit, f"{kind} handover {value:.3f} s > {limit} s"
    for fault in result.faults:
        if fault.kind == "stop":
            assert fault.resumed_at is not None
            seen = fault.member.wait_event("sigcont", 5, after=fault.resumed_at)
            assert seen["is_leader"] is False, seen
            fault.member.wait_event("demoted", 5, after=fault.resumed_at)
    assert len(result.terms) >= len([f for f in result.faults if f.kind != "kill_follower"])


@pytest.mark.timing  # hand-overs within 0.5 s (of the ttl), samples 0.25 s apart
@pytest.mark.slow
def test_two_processes_exactly_one_leads(cluster: LeaseCluster) -> None:
    chaos(cluster, 2, 9.0, ["kill", "stop", "term"])


@pytest.mark.timing  # hand-overs within 0.5 s (of the ttl), samples 0.25 s apart
@pytest.mark.slow
def test_five_processes_exactly_one_leads(cluster: LeaseCluster) -> None:
    chaos(cluster, 5, 20.0, ["kill", "stop", "term", "kill_follower", "kill", "stop", "term"])


# -- failover -------------------------------------------------------------------------


@pytest.mark.timing  # within 0.5 s of the ttl
def test_sigkill_of_the_holder_follower_leads_within_ttl(cluster: LeaseCluster) -> None:
    leader, _ = start_pair(cluster)
    cluster.wait_settled(cluster.spawn(2), 0.0, STARTUP)
    with cluster.sampling() as samples:
        handovers = cluster.hand_overs(leader, cluster.kill, 3, TTL + 3, STARTUP)
    report("SIGKILL (ttl 2 s)", handovers)
    assert max(handovers) <= TTL + 0.5
    assert not samples.several()
    cluster.check_terms()


@pytest.mark.timing  # hand-overs within 0.5 s
def test_graceful_stop_hands_over_within_half_a_second(cluster: LeaseCluster) -> None:
    leader, _ = start_pair(cluster)

    def stopped_as_follower(member: Member) -> None:
        assert member.proc.wait(timeout=10) == 0
        stopped = member.find("stopped")
        assert stopped is not None and stopped["is_leader"] is False

    with cluster.sampling() as samples:
        handovers = cluster.hand_overs(
            leader, cluster.terminate, 3, 3, STARTUP, stopped_as_follower
        )
    report("graceful stop()", handovers)
    assert max(handovers) <= 0.5
    assert not samples.several()
    cluster.check_terms()


@pytest.mark.timing  # within 0.5 s of a renew interval
def test_resign_hands_over(cluster: LeaseCluster, redis_url: str) -> None:
    leader, follower = start_pair(cluster)
    store = open_redis(StoreParams(redis_url, cluster.prefix, 1.0))
    asked = time.monotonic()
    holder = store.lock.request_resign(cluster.election)
    assert holder is not None and holder.instance_id == leader.ident
    term = cluster.wait_term_after(asked, RENEW + 1, other_than=leader)
    print(f"\nHANDOVER redis resign: {(term.start - asked) * 1000:.1f} ms")
    assert term.member is follower and term.start - asked <= RENEW + 0.5
    leader.wait_event("demoted", 1, after=asked)
    cluster.check_terms()


def test_keys_are_json_under_one_hash_tag(redis_url: str) -> None:
    """What a lease leaves in Redis: JSON values, one hash tag, an epoch that never expires."""
    cfg = LeaderConfig.from_mapping(
        {"leader_url": redis_url, "leader_ttl": TTL, "leader_renew_interval": RENEW,
         "leader_key_prefix": "myapp", "leader_instance_id": "host-1:42"}
    )  # fmt: skip
    store = open_store(cfg)
    lease = Lease.from_config("beat", cfg, store.lock)
    lease.start()
    try:
        wait_for(lease.is_leader, 5)
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        assert sorted(client.keys("*")) == ["{myapp:beat}:epoch", "{myapp:beat}:lock"]
        value = json.loads(client.get("{myapp:beat}:lock"))
        assert value["epoch"] == lease.epoch == int(client.get("{myapp:beat}:epoch"))
        assert value["holder"] == "host-1:42" and len(value["token"]) >= 16
        assert 0 < client.pttl("{myapp:beat}:lock") <= TTL * 1000
        assert client.ttl("{myapp:beat}:epoch") == -1
        assert list(store.lock.holders()) == ["beat"]
        holder = store.lock.holder("beat")
        assert holder is not None and holder.instance_id == "host-1:42"
    finally:
        lease.stop()
    assert client.keys("*") == ["{myapp:beat}:epoch"], "stop() deleted the term, kept the epoch"


@pytest.mark.timing  # asked within 0.5 s of SIGCONT
def test_sigstop_past_ttl_holder_stops_believing_first_and_rejoins(
    cluster: LeaseCluster,
) -> None:
    a, b = start_pair(cluster)
    with cluster.sampling() as samples:
        paused = cluster.pause(a)
        b_term = cluster.wait_term_after(paused, TTL + 1, other_than=a)
        assert b_term.member is b
        wait_for(lambda: cluster.leader() is b, 1)
        # Keep a paused past the ttl, then wake it and ask it from the inside.
        time.sleep(max(0.0, paused + TTL + 0.3 - time.monotonic()))
        resumed = cluster.resume(a)
        seen = a.wait_event("sigcont", 2, after=resumed)
        demoted = a.wait_event("demoted", 2, after=resumed)
        rejoined = a.wait_event("follow", RENEW + TTL + 1, after=demoted["t"], holder_id=b.ident)
        time.sleep(RENEW)  # observe the settled state for one more interval
    print(
        f"\nSIGSTOP: a's belief ended {b_term.start - seen['valid_until']:.3f} s before b's term; "
        f"after SIGCONT a answered in {(seen['t'] - resumed) * 1000:.1f} ms: "
        f"is_leader={seen['is_leader']}"
    )
    assert seen["is_leader"] is False
    # Either the deadline had passed, or the lease thread (which woke up too) had
    # already stepped down and zeroed it.
    assert seen["valid_until"] == 0 or seen["now"] >= seen["valid_until"]
    assert seen["t"] - resumed < 0.5, "asked right after SIGCONT"
    assert seen["valid_until"] <= b_term.start, "a's belief ended before b's term began"
    assert demoted["is_leader"] is False
    assert rejoined["holder_epoch"] == b_term.epoch
    a_term = [t for t in cluster.terms() if t.member is a][-1]
    assert a_term.end <= b_term.start
    assert cluster.leader() is b
    assert not samples.several()
    cluster.check_terms()


# -- the store goes away --------------------------------------------------------------


@pytest.mark.timing  # demoted within 0.2 s of the ttl
def test_redis_killed_nobody_leads_then_a_leader_is_back(
    cluster: LeaseCluster, redis_server: RedisServer
) -> None:
    leader, _ = start_pair(cluster)
    cluster.wait_settled(cluster.spawn(2), 0.0, STARTUP)
    old_epochs = [t.epoch for t in cluster.terms()]
    with cluster.sampling() as samples:
        killed = time.monotonic()
        redis_server.kill()
        killed_done = time.monotonic()
        demoted = leader.wait_event("demoted", TTL + 1, after=killed)
        # Keep it down well past the ttl.
        time.sleep(max(0.0, killed_done + TTL + 1.0 - time.monotonic()))
        restarting = time.monotonic()
        redis_server.start()
        up = time.monotonic()
        new = cluster.wait_term_after(killed, RENEW + 3)
        cluster.wait_leader(2)
    old = [t for t in cluster.terms() if t.member is leader and t.start < killed][-1]
    print(
        f"\nREDIS KILLED: leader's belief ended {old.end - killed:.3f} s after the kill "
        f"(noticed at {demoted['t'] - killed:.3f} s); down {restarting - killed:.2f} s; "
        f"new leader {new.start - up:.3f} s after redis answered "
        f"({new.start - restarting:.3f} s after start() was called), epoch {old.epoch} -> "
        f"{new.epoch}"
    )
    assert old.end - killed <= TTL, "the leader stopped leading within the ttl"
    assert demoted["t"] - killed <= TTL + 0.2
    assert new.start >= restarting, "nobody took a term while redis was down"
    while_down = [who for t, who in samples.snapshot() if old.end <= t < restarting]
    assert len(while_down) > 100, "the sampler watched the outage"
    assert not any(while_down), "somebody led while redis was down"
    assert new.start - up <= RENEW + 0.5
    assert new.epoch > max(old_epochs), "epochs grow past the store's lost ones"
    assert not samples.several()
    cluster.check_terms()


@pytest.mark.timing  # demoted within 0.25 s of its deadline
def test_partition_leader_belief_ends_before_anyone_is_elected(
    cluster: LeaseCluster, redis_server: RedisServer, redis_url: str, tcp_proxy
) -> None:
    proxy = tcp_proxy("127.0.0.1", redis_server.port)
    a, b = start_pair(cluster, a=proxy.url_for(redis_url))
    with cluster.sampling() as samples:
        held = time.monotonic()
        proxy.hold()
        b_term = cluster.wait_term_after(held, TTL + 1, other_than=a)
        demoted = a.wait_event("demoted", 1, after=held)
        time.sleep(max(0.0, held + 2.5 * TTL - time.monotonic()))  # the partition lasts 2.5 ttl
        released = time.monotonic()
        proxy.release()
        rejoined = a.wait_event("follow", TTL + 2, after=released, holder_id=b.ident)
        time.sleep(RENEW)  # observe the settled state for one more interval
    a_term = [t for t in cluster.terms() if t.member is a and t.start < held][-1]
    print(
        f"\nPARTITION: a's belief ended {a_term.end - held:.3f} s into the hold, "
        f"{(b_term.start - a_term.end) * 1000:.1f} ms before b's term "
        f"(b elected {b_term.start - held:.3f} s into the hold)"
    )
    assert b_term.member is b
    assert a_term.end <= b_term.start
    assert demoted["t"] <= a_term.end + 0.25, "a noticed at its deadline"
    assert b_term.start - held <= TTL + 0.5
    assert rejoined["holder_epoch"] == b_term.epoch
    assert cluster.leader() is b
    assert not samples.several()
    cluster.check_terms()


SECRET = "s3cr3t-Pw"


@pytest.mark.timing  # leads within 0.5 s of a renew interval
def test_unreachable_at_start_then_leads_once_redis_is_there(caplog) -> None:
    """No crash: logs (password masked), keeps trying, leads soon after Redis appears."""
    port = free_port()
    url = f"redis://:{SECRET}@127.0.0.1:{port}/0"
    cfg = LeaderConfig.from_mapping(
        {"leader_url": url, "leader_ttl": TTL, "leader_renew_interval": RENEW}
    )
    caplog.set_level(logging.INFO, logger="celery_leader")
    lease = Lease.from_config("start-down", cfg, open_store(cfg).lock)
    server: subprocess.Popen[bytes] | None = None
    lease.start()
    try:
        wait_for(lambda: "unreachable" in caplog.text, 5)
        assert not lease.is_leader()
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--requirepass", SECRET],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        probe = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)

        def answers() -> bool:
            try:
                return bool(probe.ping())
            except redis.ConnectionError:
                return False

        wait_for(answers, 10, interval=0.005)
        up = time.monotonic()
        wait_for(lease.is_leader, RENEW + 2)
        took = time.monotonic() - up
        print(f"\nSTART WITH REDIS DOWN: leader {took:.3f} s after redis answered")
        assert took <= RENEW + 0.5
        assert "answers again" in caplog.text
        assert "elected leader" in caplog.text
        assert f"redis://:***@127.0.0.1:{port}/0" in caplog.text
        assert SECRET not in caplog.text
    finally:
        lease.stop()
        if server is not None:
            server.kill()
            server.wait(timeout=10)


# -- steady-state cost -----------------------------------------------------------------


class Monitor:
    """Raw MONITOR connection: (unix time, client address, command) of every command.

    Commands that a Lua script runs are shown by Redis with the address ``lua``;
    they are not sent by any client, so they are kept apart.
    """

    LINE = re.compile(r'^\+(\d+\.\d+) \[\d+ ([^\]]+)\] "([^"]*)"')

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        self.seen: list[tuple[float, str, str]] = []
        self._stop = threading.Event()
        self._buffer = b""
        self._read_until(lambda: b"+OK\r\n" in self._buffer)
        self._buffer = self._buffer.split(b"+OK\r\n", 1)[1]
        self.sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read_until(self, done) -> None:
        while not done():
            self._buffer += self.sock.recv(65536)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return
            self._buffer += data
            *lines, self._buffer = self._buffer.split(b"\r\n")
            for line in lines:
                match = self.LINE.match(line.decode(errors="replace"))
                if match:
                    self.seen.append((float(match[1]), match[2], match[3].lower()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def test_steady_state_memory_and_commands(
    cluster: LeaseCluster, redis_server: RedisServer, redis_url: str
) -> None:
    """A leader and a follower: heap well under 1 MB each, few commands.

    The leader sends at most one command per renewal; the follower, the
    election's designated successor, one per ``WATCH_INTERVAL``.

    Commands are counted per client connection with MONITOR (each process names its
    connections with ``client_name``), so only what the lease *sends* counts; Redis's
    INFO commandstats also counts the GET/PEXPIRE/... run inside the Lua scripts
    under their own names, which a client never sent. The commandstats EVALSHA count
    is checked against MONITOR as a cross-check.
    """
    named = {
        "a": f"{redis_url}?client_name=lease-leader",
        "b": f"{redis_url}?client_name=lease-follower",
    }
    cluster.spawn(0, url=named["a"], extra=["--tracemalloc"])
    leader = cluster.wait_leader(STARTUP)
    follower = cluster.spawn(1, url=named["b"], extra=["--tracemalloc"])
    cluster.wait_settled(follower, 0.0, STARTUP)
    wait_for(lambda: len([e for e in follower.events() if e["ev"] == "follow"]) >= 3, 5)

    monitor = Monitor(redis_server.port)
    try:
        for member in (leader, follower):
            began = time.monotonic()
            send_usr2(member)
            member.wait_event("mem_begin", 5, after=began)
        redis_server.reset_stats()
        w0 = time.time()
        time.sleep(6 * RENEW + 0.1)  # the observation window
        command_stats = redis_server.commandstats()
        w1 = time.time()
        for member in (leader, follower):
            send_usr2(member)
        with redis_server.client() as client:
            names = {c["addr"]: c["name"] for c in client.client_list()}
    finally:
        monitor.close()
    mem = {m.ident: m.wait_event("mem", 5) for m in (leader, follower)}

    window = w1 - w0
    in_window = [(t, addr, cmd) for t, addr, cmd in monitor.seen if w0 <= t <= w1]
    by_client: dict[str, list[str]] = {}
    for _, addr, cmd in in_window:
        if addr == "lua":
            continue
        by_client.setdefault(names.get(addr, f"unknown {addr}"), []).append(cmd)
    allowed = window / RENEW + 1
    watching = window / WATCH_INTERVAL + 1
    print(
        f"\nSTEADY STATE over {window:.2f} s (renew interval {RENEW:.3f} s, so at most "
        f"{allowed:.1f} commands for the leader, {watching:.1f} for the watching follower):"
    )
    for name, cmds in sorted(by_client.items()):
        print(f"  {name}: {len(cmds)} commands {sorted(set(cmds))}")
    lua = sorted({cmd for _, addr, cmd in in_window if addr == "lua"})
    print(f"  (inside Lua, not sent by clients: {lua}; commandstats: {command_stats})")
    for ident, sample in mem.items():
        print(f"  {ident}: {describe_memory(sample)}")

    lease_clients = {k: v for k, v in by_client.items() if k.startswith("lease-")}
    # The only other connections are this test's own short-lived ones (gone from
    # CLIENT LIST by the end): they may only have sent what the test sends.
    others = {c for k, v in by_client.items() if not k.startswith("lease-") for c in v}
    assert others <= {"hello", "client", "config", "info"}, f"unattributed commands: {others}"
    assert set(lease_clients) == {"lease-leader"} or set(lease_clients) == {
        "lease-leader",
        "lease-follower",
    }
    assert 0 < len(lease_clients["lease-leader"]) <= allowed
    assert len(lease_clients.get("lease-follower", [])) <= watching
    evalsha = sum(cmds.count("evalsha") for cmds in lease_clients.values())
    assert abs(command_stats.get("evalsha", 0) - evalsha) <= 2
    assert mem[leader.ident]["is_leader"] and not mem[follower.ident]["is_leader"]
    for sample in mem.values():
        assert sample["end"] < 512 * 1024, "well under 1 MB, lazy imports included"
        assert sample["peak"] < 512 * 1024
        assert sample["without_imports"] < 256 * 1024
        # Both numbers are instants, and each member's lease thread spends its idle time
        # blocked in ``sock.recv(DEFAULT_SOCKET_READ_SIZE)`` on its pub/sub connection
        # (``Subscription.message``), which holds a fresh 32 KB ``bytes`` until the read
        # returns. A sample taken while the thread was renewing or between two reads
        # lacks that buffer; one taken while it waits holds it: 34,049 bytes of "growth"
        # on a loaded machine was that buffer (32,801) plus 1.2 KB of frames. So the
        # bound is the 32 KB of real growth this checks for, plus that one buffer.
        in_flight_read = redis.connection.DEFAULT_SOCKET_READ_SIZE + sys.getsizeof(b"")
        growth = sample["end"] - sample["begin"]
        assert growth < 32 * 1024 + in_flight_read, "no growth at steady state"
        assert sample["threads_end"] == sample["threads_begin"]
        assert sample["fds_end"] == sample["fds_begin"]


def send_usr2(member: Member) -> None:
    send_signal(member.proc, signal.SIGUSR2)


def test_a_claim_batch_is_one_round_trip_without_script_exists(
    redis_url: str, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EVALSHA, pipelined: one socket write per batch, one EVALSHA per 500 claims.

    redis-py's pipelined Script objects send SCRIPT EXISTS before every
    execute; the store sends EVALSHA itself and falls back to EVAL only when
    the server answers NOSCRIPT (after a start or SCRIPT FLUSH).
    """
    store = open_redis(StoreParams(redis_url, "count", 1.0))
    sends: list[int] = []
    real_send = redis.connection.AbstractConnection.send_packed_command

    def counted(self, *args, **kwargs):
        sends.append(1)
        return real_send(self, *args, **kwargs)

    def batch(n: int, tag: str) -> list[bool]:
        claims = [Write(f"{tag}{j}", None, "1") for j in range(n)]
        sends.clear()
        with monkeypatch.context() as patch:
            patch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
            results = store.records.claim(Fence("beat", term), claims)
        assert results == [True] * n
        return results

    try:
        term = store.lock.acquire("beat", "me", TTL, 0).term
        assert term is not None
        batch(1, "warm")  # the server's script cache is empty: NOSCRIPT, then EVAL
        for n, chunks in ((1, 1), (200, 1), (1200, 3)):
            redis_server.reset_stats()
            batch(n, f"b{n}-")
            stats = redis_server.commandstats()
            print(f"\nCLAIM BATCH of {n}: {len(sends)} round trip(s), commandstats {stats}")
            assert len(sends) == 1, "one round trip"
            assert stats.get("evalsha") == chunks
            assert not {"script|exists", "script|load", "eval"} & set(stats)
        with redis_server.client() as client:
            client.script_flush()
        redis_server.reset_stats()
        batch(1, "flushed")
        assert redis_server.commandstats().get("eval") == 1, "NOSCRIPT falls back to EVAL once"
    finally:
        store.close()


def test_wrong_key_types_are_named(redis_url: str) -> None:
    """A key of the wrong type at the lease or epoch key: the error names it."""
    store = open_redis(StoreParams(redis_url, "typed", 1.0))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.hset("{typed:beat}:epoch", "x", "1")
        with pytest.raises(StoreUnavailable, match=r"'\{typed:beat\}:epoch' holds 'hash'"):
            store.lock.acquire("beat", "me", TTL, 0)
        client.delete("{typed:beat}:epoch")
        client.sadd("{typed:beat}:lock", "x")
        with pytest.raises(StoreUnavailable, match=r"'\{typed:beat\}:lock' holds 'set'"):
            store.lock.acquire("beat", "me", TTL, 0)
        with pytest.raises(StoreUnavailable, match=r"'\{typed:beat\}:lock' holds 'set'"):
            store.lock.holder("beat")
    finally:
        store.close()
        client.close()


def test_journal_logs_of_any_name_are_two_keys_of_the_election(
    redis_url: str, redis_server: RedisServer
) -> None:
    """A log is a hash and a sorted set scored 0, named by the percent-encoded log:
    a name with braces and colons stays under the election's hash tag and is never
    taken for an election; a key of the wrong type there is named. A write of
    several logs, dropping what falls out, is one script call; so is a page."""
    store = open_redis(StoreParams(redis_url, "jr", 1.0))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    log = "audit/a job}:epoch"
    try:
        store.journal.write("beat", [JournalWrite(log, f"{n:03d}", f"r{n}", 3) for n in range(4)])
        store.journal.read("beat", log, 1)  # the server has both scripts cached from here
        redis_server.reset_stats()
        store.journal.write("beat", [JournalWrite(each, "004", "r4", 3) for each in (log, "audit")])
        assert redis_server.commandstats().get("evalsha") == 1
        redis_server.reset_stats()
        assert store.journal.read("beat", log, 2, before="004") == [("003", "r3"), ("002", "r2")]
        assert redis_server.commandstats().get("evalsha") == 1
        name = "audit/a%20job%7D%3Aepoch"
        records, keys = f"{{jr:beat}}:journal:{name}", f"{{jr:beat}}:journal-keys:{name}"
        assert sorted(client.keys(f"{{jr:beat}}:*{name}")) == [keys, records]
        kept = [("002", 0.0), ("003", 0.0), ("004", 0.0)]
        assert client.zrange(keys, 0, -1, withscores=True) == kept
        assert client.hgetall(records) == {"002": "r2", "003": "r3", "004": "r4"}
        assert list(store.lock.holders()) == [], "no election is made of a log name"
        store.journal.write("beat", [JournalWrite("terms", "foreign", "a key like any", 3)])
        assert store.journal.read("beat", "terms", 3) == [("foreign", "a key like any")]
        client.set("{jr:beat}:journal-keys:terms", "x")
        named = r"'\{jr:beat\}:journal-keys:terms' holds 'string'.*sorted set"
        with pytest.raises(StoreUnavailable, match=named):
            store.journal.read("beat", "terms", 10)
        with pytest.raises(StoreUnavailable, match="journal-keys:terms"):
            store.journal.write("beat", [JournalWrite("terms", "1", "x", 10)])
    finally:
        store.close()
        client.close()


def test_entries_are_read_in_pages_whole(
    redis_url: str, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schedule entries come back whole across many HSCAN pages, none in one
    big call (one HGETALL of a million entries outlasted the socket timeout)."""
    monkeypatch.setattr(redis_entries, "ENTRIES_PAGE", 100)
    store = open_redis(StoreParams(redis_url, "paged", 1.0))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        # Past the listpack limit (128 fields by default), so HSCAN really pages.
        stored = {f"e{i}": f'{{"n":{i}}}' for i in range(2_500)}
        assert all(store.entries.edit("beat", [Edit(k, None, v) for k, v in stored.items()]))
        version = store.entries.version("beat")
        redis_server.reset_stats()
        assert store.entries.load("beat") == (version, stored)
        stats = redis_server.commandstats()
        assert stats.get("hscan", 0) >= 2_500 // 100, stats
        assert "hgetall" not in stats, stats

        client.delete("{paged:beat}:entries")
        client.rpush("{paged:beat}:entries", "not ours")
        with pytest.raises(StoreUnavailable, match=r"'\{paged:beat\}:entries' holds 'list'"):
            store.entries.load("beat")
    finally:
        store.close()
        client.close()


def test_an_edit_that_recorded_nothing_makes_older_readers_read_everything(
    redis_url: str,
) -> None:
    """An editor of a release that kept no changes (a rolling upgrade) moves the
    version alone: a reader from before it must not be told only the later edits."""
    store = open_redis(StoreParams(redis_url, "old", 1.0))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert store.entries.edit("beat", [Edit("a", None, "a1")]) == [True]
        version, _ = store.entries.load("beat")
        # The previous release's edit: the entry and the version, no change recorded.
        client.hset("{old:beat}:entries", "b", "b1")
        client.incr("{old:beat}:entries-version")
        assert store.entries.changes_since("beat", version) is None
        assert store.entries.edit("beat", [Edit("a", "a1", "a2")]) == [True]
        assert store.entries.changes_since("beat", version) is None, "b would be missed"
        assert store.entries.changes_since("beat", version + 1) == (
            version + 2,
            {"a": "a2"},
        )
    finally:
        store.close()
        client.close()


def test_entry_changes_kept_are_bounded_and_an_older_reader_reads_everything(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_entries, "CHANGES_KEPT", 3)
    store = open_redis(StoreParams(redis_url, "changes", 1.0))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        versions = []
        for i in range(6):
            assert store.entries.edit("beat", [Edit(f"e{i}", None, str(i))]) == [True]
            versions.append(store.entries.version("beat"))
        # e0..e2 were dropped (the marker '' remembers up to which version): a
        # reader from before them cannot be told, one from after them can.
        assert client.zcard("{changes:beat}:entries-changes") == 4
        assert store.entries.changes_since("beat", versions[1]) is None
        assert store.entries.changes_since("beat", versions[2]) == (
            versions[5],
            {"e3": "3", "e4": "4", "e5": "5"},
        )
        # An editor that moves the version without recording the change (a
        # release from before the changes were kept): readers read everything.
        client.incr("{changes:beat}:entries-version")
        assert store.entries.changes_since("beat", versions[5]) is None

        client.delete("{changes:beat}:entries-changes")
        client.set("{changes:beat}:entries-changes", "not ours")
        with pytest.raises(StoreUnavailable, match="entries-changes' holds 'string'"):
            store.entries.edit("beat", [Edit("e9", None, "9")])
        with pytest.raises(StoreUnavailable, match="entries-changes' holds 'string'"):
            store.entries.changes_since("beat", 0)
    finally:
        store.close()
        client.close()
