"""The Redis store behind TLS, a unix socket, Sentinel and Cluster, on real servers.

Each topology runs the same check: three leases on separate connections elect
exactly one leader, a graceful stop hands over at once, epochs grow, and a
fenced claim of many entries works (in Cluster, where pipelines refuse
scripts, too). Sentinel and Cluster also hand a SIGKILLed holder over without
waiting for its ttl (presence; in Cluster it must live on the slot's node).
Then ``?cluster=true`` where there is no cluster: refused in one line by a
server without cluster support, an outage when nothing listens.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_leader.backends import JournalWrite, RunWrite, Write, open_store
from celery_leader.election.lease import Lease
from celery_leader.exceptions import StoreMisconfigured, StoreUnavailable
from celery_leader.settings.config import LeaderConfig
from harness.procs import Procs
from harness.servers import RedisServer, free_port
from harness.waiting import wait_for
from tests.apps.lease_cluster import LeaseCluster
from tests.test_redis_presence import CRASH, STARTUP
from tests.test_redis_presence import TTL as DEFAULT_TTL

TTL = 2.0
CELERY = Path(sys.executable).with_name("celery")
REPO = Path(__file__).resolve().parents[1]


class _TlsNode(RedisServer):
    """TLS only: the plain port is off, so readiness is checked over TLS."""

    def __init__(self, cert: Path, key: Path) -> None:
        super().__init__()
        self.cert = cert
        self.extra_args = [
            "--tls-port", str(self.port),
            "--tls-cert-file", str(cert),
            "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(cert),
            "--tls-auth-clients", "no",
            "--port", "0",  # after the plain --port: TLS only
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0?ssl_cert_reqs=required&ssl_ca_certs={self.cert}"

    def _is_accepting(self) -> bool:
        try:
            with redis.Redis.from_url(self.url, socket_connect_timeout=0.5) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False


def _run_election(url: str) -> None:
    config = LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL})
    stores = [open_store(config) for _ in range(3)]
    leases = [
        Lease("topo", s.lock, ttl=TTL, renew_interval=TTL / 3, instance_id=f"i{n}")
        for n, s in enumerate(stores)
    ]
    try:
        for lease in leases:
            lease.start()
        first = wait_for(lambda: [x for x in leases if x.is_leader()], 5, message="a leader")
        assert len(first) == 1
        leader = first[0]
        records = stores[leases.index(leader)].records
        assert leader.epoch is not None
        epoch = leader.epoch
        fence = leader.fence()
        assert fence is not None
        results = records.claim(fence, [Write(f"e{i}", None, "1") for i in range(1200)])
        assert results == [True] * 1200
        assert len(records.load("topo")) == 1200

        stopped_at = time.monotonic()
        leader.stop()
        others = [x for x in leases if x is not leader]
        second = wait_for(lambda: [x for x in others if x.is_leader()], 2, message="a new leader")
        took = time.monotonic() - stopped_at
        assert len(second) == 1
        assert second[0].epoch is not None and second[0].epoch > epoch
        assert took < 0.5, f"graceful hand-over took {took:.3f}s"
        # The old term can no longer claim anything.
        assert records.claim(fence, [Write("e1", "1", "2")]) == [False]
    finally:
        for lease in leases:
            lease.stop()
        for store in stores:
            store.close()


def _run_records(url: str) -> None:
    """The run ledger's records and the journal: one script on the election's node
    (one hash tag, whatever the entry or log name holds)."""
    a, b = (open_store(LeaderConfig.from_mapping({"leader_url": url})) for _ in range(2))
    try:
        for election in ("beat", "reports"):  # elections on different cluster slots
            assert a.runs.put(election, RunWrite("job@1", None, "started", 60)) == (True, "started")
            assert b.runs.put(election, RunWrite("job@1", None, "again", 60)) == (False, "started")
            assert b.runs.put(election, RunWrite("job@1", "started", "done", 60)) == (True, "done")
            assert a.runs.runs_of(election, "job", 10) == [("job@1", "done")]
            assert [s.last for s in a.runs.summaries(election)] == ["done"]
            log = "audit/a job: {x} \u00e9"
            a.journal.write(election, [JournalWrite(n, "1", "paused", 10) for n in ("audit", log)])
            assert b.journal.read(election, log, 10) == b.journal.read(election, "audit", 10)
            assert b.journal.read(election, log, 10) == [("1", "paused")]
    finally:
        a.close()
        b.close()


def _crash_hand_over(url: str, procs: Procs, workdir: Path) -> None:
    """Lease processes at the default ttl: a SIGKILLed holder is replaced within CRASH."""
    cluster = LeaseCluster(procs, workdir, url, ttl=DEFAULT_TTL, settle_follows=1)
    try:
        leader = cluster.spawn(0)
        assert cluster.wait_leader(STARTUP) is leader
        cluster.wait_settled(cluster.spawn(1), 0.0, STARTUP)
        [took] = cluster.hand_overs(leader, cluster.kill, 1, DEFAULT_TTL, STARTUP)
        print(f"\nHANDOVER SIGKILL at ttl {DEFAULT_TTL:g} s via {url}: {took * 1000:.0f} ms")
        assert took <= CRASH
        cluster.check_terms()
    finally:
        cluster.close()


@pytest.fixture
def tls_node(tmp_path: Path) -> Iterator[_TlsNode]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    node = _TlsNode(cert, key)
    node.start()
    yield node
    node.close()


@pytest.mark.timing  # a graceful hand-over within 0.5 s
def test_tls(tls_node: _TlsNode) -> None:
    _run_election(tls_node.url)


@pytest.mark.timing  # a graceful hand-over within 0.5 s
def test_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "redis.sock"
    node = RedisServer("--unixsocket", str(sock), "--unixsocketperm", "700")
    node.start()
    try:
        _run_election(f"unix://{sock}?db=0")
    finally:
        node.close()


@pytest.mark.timing  # a graceful hand-over within 0.5 s
def test_sentinel(procs: Procs, tmp_path: Path) -> None:
    master = RedisServer()
    master.start()
    sentinel = RedisServer()
    conf = sentinel.root / "sentinel.conf"
    conf.write_text(
        f"port {sentinel.port}\nbind 127.0.0.1\n"
        f"sentinel monitor mymaster 127.0.0.1 {master.port} 1\n"
    )
    sentinel._launch = lambda: sentinel._popen(["redis-server", str(conf), "--sentinel"])  # type: ignore[method-assign]
    sentinel.start()
    try:
        _run_election(f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster/0")
        _crash_hand_over(f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster/0", procs, tmp_path)
    finally:
        sentinel.close()
        master.close()


@pytest.mark.timing  # a graceful hand-over within 0.5 s
def test_cluster(procs: Procs, tmp_path: Path) -> None:
    nodes = [
        RedisServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        for _ in range(3)
    ]
    try:
        for node in nodes:
            node.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create"]
            + [f"127.0.0.1:{n.port}" for n in nodes]
            + ["--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )

        def cluster_ok() -> bool:
            with nodes[0].client() as client:
                return all(
                    redis.Redis(port=n.port).cluster("info")["cluster_state"] == "ok" for n in nodes
                ) and bool(client.ping())

        wait_for(cluster_ok, 20, interval=0.1, message="cluster_state:ok on every node")
        _run_election(f"redis://127.0.0.1:{nodes[0].port}/0?cluster=true")
        _run_records(f"redis://127.0.0.1:{nodes[0].port}/0?cluster=true")
        _crash_hand_over(f"redis://127.0.0.1:{nodes[0].port}/0?cluster=true", procs, tmp_path)
    finally:
        for node in nodes:
            node.close()


# -- ?cluster=true where there is no cluster -----------------------------------------


def test_cluster_url_on_a_plain_redis_is_refused_in_one_line(redis_url: str) -> None:
    url = f"{redis_url}?cluster=true"
    config = LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL})
    store = open_store(config)  # connects to nothing yet
    try:
        with pytest.raises(StoreMisconfigured) as info:
            store.lock.acquire("topo", "i0", TTL, 0)
    finally:
        store.close()
    message = str(info.value)
    assert "\n" not in message and "leader_url" in message and "cluster support disabled" in message
    assert isinstance(info.value, StoreUnavailable), "retried like an outage"


def test_cluster_url_with_nothing_listening_is_an_outage() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?cluster=true"
    store = open_store(LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL}))
    try:
        with pytest.raises(StoreUnavailable) as info:
            store.lock.acquire("topo", "i0", TTL, 0)
    finally:
        store.close()
    assert not isinstance(info.value, StoreMisconfigured)
    assert "\n" not in str(info.value)


def test_beat_with_a_cluster_url_on_a_plain_redis_says_so_once_and_keeps_running(
    redis_url: str, procs: Procs, tmp_path: Path
) -> None:
    """Beat does not die: one line names leader_url, and nobody leads through that URL."""
    renew = TTL / 3
    proc = procs.spawn_python(
        CELERY,
        *("-A", "tests.apps.beat_app", "beat", "-S", "leader", "-l", "info"),
        env={
            "BROKER_URL": redis_url,
            "LEADER_URL": f"{redis_url}?cluster=true",
            "LEADER_TTL": str(TTL),
            "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)])),
        },
        cwd=tmp_path,
    )
    proc.wait_for_line("cluster support disabled", 30)
    time.sleep(4 * renew)  # four more attempts, which must say nothing new
    assert proc.alive
    said = [line for line in proc.lines() if "cluster support disabled" in line]
    assert len(said) == 1, said
    assert "leader_url" in said[0]
    assert "Traceback" not in proc.output()
    assert "elected" not in proc.output()
