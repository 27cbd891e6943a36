"""The test infrastructure itself: if these fail, no other failure means anything."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import amqp
import psycopg
import pymysql
import pytest
import redis

from harness.fakeclock import FakeClock
from harness.procs import Procs
from harness.procs import signal as send_signal
from harness.servers import (
    CLUSTER_BUS_OFFSET,
    MariaDbServer,
    PostgresServer,
    RabbitServer,
    RedisServer,
)
from harness.waiting import wait_for


def test_redis_url_is_empty_and_usable(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    assert client.dbsize() == 0
    client.set("leftover", "1")


def test_redis_restart_keeps_port_and_comes_back_empty(
    redis_server: RedisServer, redis_url: str
) -> None:
    client = redis_server.client()
    client.set("k", "v")
    port = redis_server.port

    redis_server.kill()
    assert not redis_server.running
    with pytest.raises(redis.ConnectionError):
        client.ping()

    redis_server.start()
    assert redis_server.port == port
    assert redis_server.url == redis_url
    assert client.get("k") is None

    redis_server.stop()


def test_redis_is_running_again_after_a_test_stopped_it(redis_url: str) -> None:
    # Relies on file order: the test above leaves the server stopped.
    assert redis.Redis.from_url(redis_url).ping()


def test_commandstats_counts_calls_since_reset(redis_server: RedisServer) -> None:
    redis_server.reset_stats()
    client = redis_server.client()
    for i in range(3):
        client.set("n", i)
    assert redis_server.commandstats()["set"] == 3


def test_proxy_forwards(redis_server: RedisServer, redis_url: str, tcp_proxy) -> None:
    proxy = tcp_proxy("127.0.0.1", redis_server.port)
    client = redis.Redis.from_url(proxy.url_for(redis_url))
    client.set("through", "proxy")
    assert redis.Redis.from_url(redis_url).get("through") == b"proxy"


def test_proxy_hold_stalls_and_release_delivers(redis_server: RedisServer, tcp_proxy) -> None:
    proxy = tcp_proxy("127.0.0.1", redis_server.port)
    url = proxy.url_for(redis_server.url)
    patient = redis.Redis.from_url(url)
    assert patient.ping()  # connected before the stall, like a leader renewing its lease

    proxy.hold()
    impatient = redis.Redis.from_url(url, socket_timeout=0.3, socket_connect_timeout=0.3)
    with pytest.raises(redis.TimeoutError):
        impatient.ping()

    result: list[bool] = []
    pinger = threading.Thread(target=lambda: result.append(patient.ping()))
    pinger.start()
    pinger.join(timeout=0.3)
    assert pinger.is_alive(), "PING went through a held proxy"

    proxy.release()
    pinger.join(timeout=5)
    assert result == [True]
    assert redis.Redis.from_url(url, socket_timeout=1).ping()


def test_proxy_hold_replies_serves_requests_and_withholds_the_answers(
    redis_server: RedisServer, tcp_proxy
) -> None:
    proxy = tcp_proxy("127.0.0.1", redis_server.port)
    direct = redis_server.client()
    # A raw socket, so that nothing retries or times out on the client's side.
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100) == b"+PONG\r\n"
        proxy.hold_replies()
        assert proxy.replies_waiting() == 0
        sock.sendall(b"SET held reply\r\n")
        # The request reached the server and was served ...
        wait_for(lambda: direct.get("held") == b"reply", 5, message="the SET never arrived")
        # ... and its reply waits in the proxy.
        wait_for(proxy.replies_waiting, 5, message="no reply held")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(100)
        sock.settimeout(5)
        proxy.release()
        assert sock.recv(100) == b"+OK\r\n"
        assert proxy.replies_waiting() == 0


def test_proxy_cut_closes_connections(redis_server: RedisServer, tcp_proxy) -> None:
    proxy = tcp_proxy("127.0.0.1", redis_server.port)
    # A raw socket, because redis-py would quietly reconnect after the cut.
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100) == b"+PONG\r\n"
        proxy.cut()
        assert sock.recv(100) == b""
    url = proxy.url_for(redis_server.url)
    assert redis.Redis.from_url(url).ping(), "new connections must still work after cut()"


def test_proxy_url_for_keeps_credentials(tcp_proxy) -> None:
    proxy = tcp_proxy("127.0.0.1", 1)
    assert (
        proxy.url_for("postgresql://leader:leaderpw@127.0.0.1:5432/leader?sslmode=disable")
        == f"postgresql://leader:leaderpw@127.0.0.1:{proxy.port}/leader?sslmode=disable"
    )


def test_cluster_nodes_get_ports_and_buses_no_other_process_holds() -> None:
    """Cluster ports come from 2,768 below the ephemeral range: 300 draws at random
    repeat one about 16 times over, so every one of them must be reserved."""
    draw = (
        "from harness.servers import free_port\n"
        "print(*[free_port(with_bus=True) for _ in range(300)], free_port())"
    )
    # A process of its own: its reservations end with it, not with this test run.
    out = subprocess.run(
        [sys.executable, "-c", draw], check=True, capture_output=True, text=True, timeout=60
    ).stdout.split()
    *nodes, plain = (int(port) for port in out)
    taken = nodes + [port + CLUSTER_BUS_OFFSET for port in nodes] + [plain]
    assert len(set(taken)) == len(taken)
    # Each bus below the ephemeral range, where no client connection takes it.
    assert all(port + CLUSTER_BUS_OFFSET < 32768 for port in nodes)


def test_wait_for_returns_value_and_reports_timeout() -> None:
    deadline = time.monotonic() + 0.05
    assert wait_for(lambda: time.monotonic() > deadline and "done", timeout=2) == "done"
    with pytest.raises(AssertionError, match=r"never: not true after 0\.1"):
        wait_for(lambda: False, timeout=0.1, message="never")


def test_procs_capture_output_signal_and_cleanup(procs: Procs) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *_: print('got usr1', flush=True))\n"
        "print('ready', sys.argv[1])\n"
        "while True: time.sleep(0.01)\n"
    )
    proc = procs.spawn_python(code, "arg1")
    assert proc.wait_for_line(r"^ready (\w+)$", timeout=10).group(1) == "arg1"
    send_signal(proc, signal.SIGUSR1)
    proc.wait_for_line("got usr1", timeout=10)
    send_signal(proc, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL


def test_a_process_that_ignores_its_stop_signal_leaves_its_stacks(procs: Procs) -> None:
    """Teardown SIGABRTs a process that was asked to stop and still runs: its log then
    says where each of its threads was (the hang), before the SIGKILL."""
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "def stuck():\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "stuck()\n"
    )
    proc = procs.spawn_python(code)
    proc.wait_for_line("^ready$", timeout=10)
    proc.signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    proc.kill_group()
    assert "Fatal Python error: Aborted" in proc.output()
    assert re.search(r"line 5 in stuck", proc.output()), proc.output()


def test_a_reaped_process_whose_pid_went_to_another_group_is_signalled_no_more(
    procs: Procs,
) -> None:
    """The kernel gives a reaped process's pid to the next process that needs one once
    its counter wraps (``pid_max`` 32768, thousands of forks a minute in a full run):
    teardown's SIGKILL of a reaped process's group once reached a PostgreSQL server
    another test process had just started in a session of its own."""
    done = procs.spawn_python("pass")
    assert done.wait(timeout=10) == 0  # reaped
    other = procs.spawn_python("import time; print('up', flush=True); time.sleep(60)")
    other.wait_for_line("^up$", timeout=10)
    done.popen.pid = other.pid  # as if the kernel had given the pid to that session
    done.signal(signal.SIGTERM)
    done.kill_group()
    with pytest.raises(subprocess.TimeoutExpired):  # at least this long: not signalled
        other.wait(timeout=0.5)


def test_a_reaped_process_leaves_no_orphan_of_its_group_behind(procs: Procs) -> None:
    """What a reaped process forked still holds its group's id (never reused while a
    member lives): teardown still reaches it."""
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    print('orphan', os.getpid(), flush=True); time.sleep(60)\n"
    )
    parent = procs.spawn_python(code)
    orphan = int(parent.wait_for_line(r"^orphan (\d+)$", timeout=10)[1])
    assert parent.wait(timeout=10) == 0  # reaped; its child lives on in its group
    parent.kill_group()

    def gone() -> bool:
        try:
            os.kill(orphan, 0)
        except ProcessLookupError:
            return True
        try:
            return Path(f"/proc/{orphan}/stat").read_text().split()[2] == "Z"  # killed, unreaped
        except FileNotFoundError:
            return True

    wait_for(gone, 10, message=f"orphan {orphan} of a reaped process still runs")


#: Reads the wall clock in its main thread while three other threads wait on timed
#: locks (reading clocks too, without the GIL); prints its number of reads and how
#: far each read fell outside the fake times its monotonic bracket allows (seconds,
#: rounded to the ms, each distinct value once).
_FAKE_TIME_PROBE = """
import sys, threading, time
start, origin, speed = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
stop = False
def waiter():
    lock = threading.Lock(); lock.acquire()
    while not stop:
        lock.acquire(timeout=0.0005)
for _ in range(3):
    threading.Thread(target=waiter, daemon=True).start()
offs, reads, end = set(), 0, time.monotonic() + 1.5
while time.monotonic() < end:
    before = time.monotonic_ns(); fake = time.time(); after = time.monotonic_ns()
    low = start + (before - origin) * speed / 1e9
    high = start + (after - origin) * speed / 1e9
    reads += 1
    # The test shifts the clock by 0 or +1 h: how far the nearer of the two is off.
    off = min(abs(t - min(max(t, low), high)) for t in (fake, fake - 3600))
    offs.add(round(off, 3))
stop = True
print(reads, *sorted(offs))
"""


def test_a_process_with_threads_reads_only_its_fake_clock(tmp_path: Path) -> None:
    """libfaketime, which the fake clock used before, returned the real time to about
    one read in 2,500 of a process whose other threads waited on timed locks (issue 41).
    The shim must never, nor mix two versions of a clock the test is shifting."""
    clock = FakeClock(tmp_path, datetime(2026, 3, 29, 0, 35, tzinfo=timezone.utc), 60.0)
    clock.run()
    argv = [str(clock.start.timestamp()), str(clock.origin_ns), str(clock.speed)]
    child = subprocess.Popen(
        [sys.executable, "-c", _FAKE_TIME_PROBE, *argv],
        env={**os.environ, **clock.env()},
        stdout=subprocess.PIPE,
        text=True,
    )
    shifts = 0
    while child.poll() is None:
        clock.shift("main", timedelta(hours=1 if shifts % 2 == 0 else -1))
        shifts += 1
        time.sleep(0.002)
    out, _ = child.communicate()
    clock.close()
    reads, *offs = out.split()
    # Each read is the fake time of its instant, or that plus the hour the test was
    # shifting the clock by: rounded to the ms, off by nothing.
    assert int(reads) > 1000 and shifts > 100, (reads, shifts)
    assert offs == ["0.0"], offs


@pytest.mark.postgres
def test_postgres_accepts_leader(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        user, superuser = conn.execute(
            "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    assert (user, superuser) == ("leader", False)


@pytest.mark.postgres
def test_postgres_stop_and_start(postgres_server: PostgresServer, postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE survives (x int)")
    port = postgres_server.port

    postgres_server.stop()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(postgres_url, connect_timeout=2)

    postgres_server.start()
    assert postgres_server.port == port
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM survives").fetchone() == (0,)


@pytest.mark.postgres
def test_postgres_kill_drops_sessions_and_recovers(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    holder = psycopg.connect(postgres_url, autocommit=True)
    assert holder.execute("SELECT pg_try_advisory_lock(42)").fetchone() == (True,)

    postgres_server.kill()
    with pytest.raises(psycopg.OperationalError):
        holder.execute("SELECT 1")

    postgres_server.start()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute("SELECT pg_try_advisory_lock(42)").fetchone() == (True,)


@pytest.mark.postgres
def test_postgres_url_ends_sessions_of_earlier_tests(postgres_server: PostgresServer) -> None:
    leaked = psycopg.connect(postgres_server.url, autocommit=True)
    leaked.execute("SELECT pg_advisory_lock(7)")
    leaked.execute("CREATE TABLE leftover (x int)")

    postgres_server.reset()

    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        assert conn.execute("SELECT pg_try_advisory_lock(7)").fetchone() == (True,)
        assert conn.execute("SELECT to_regclass('leftover')").fetchone() == (None,)
    with pytest.raises(psycopg.OperationalError):
        leaked.execute("SELECT 1")


def _leader_connection(server: MariaDbServer) -> pymysql.Connection:
    return pymysql.connect(
        host="127.0.0.1", port=server.port, user=server.user, password=server.password,
        database=server.user, autocommit=True, connect_timeout=2,
    )  # fmt: skip


def _one(conn: pymysql.Connection, query: str) -> object:
    with conn.cursor() as cur:
        cur.execute(query)
        row = cur.fetchone()
    return None if row is None else row[0]


@pytest.mark.mariadb
def test_mariadb_kill_drops_sessions_and_recovers_its_tables(
    mariadb_server: MariaDbServer, mariadb_url: str
) -> None:
    holder = _leader_connection(mariadb_server)
    assert _one(holder, "SELECT GET_LOCK('x', 0)") == 1
    _one(holder, "CREATE TABLE survives (x int) ENGINE = InnoDB")
    _one(holder, "INSERT INTO survives VALUES (1)")
    port = mariadb_server.port

    mariadb_server.kill()
    with pytest.raises(pymysql.err.OperationalError):
        _one(holder, "SELECT 1")

    mariadb_server.start()
    assert mariadb_server.port == port
    with _leader_connection(mariadb_server) as conn:
        assert _one(conn, "SELECT GET_LOCK('x', 0)") == 1
        assert _one(conn, "SELECT count(*) FROM survives") == 1


@pytest.mark.mariadb
def test_mariadb_url_ends_sessions_of_earlier_tests(mariadb_server: MariaDbServer) -> None:
    leaked = _leader_connection(mariadb_server)
    _one(leaked, "SELECT GET_LOCK('y', 0)")
    _one(leaked, "CREATE TABLE leftover (x int)")

    mariadb_server.reset()

    with _leader_connection(mariadb_server) as conn:
        assert _one(conn, "SELECT GET_LOCK('y', 0)") == 1
        assert _one(conn, "SELECT count(*) FROM information_schema.tables"
                          " WHERE table_schema = 'leader'") == 0  # fmt: skip
    with pytest.raises(pymysql.err.OperationalError):
        _one(leaked, "SELECT 1")


def _amqp_connect(url: str) -> amqp.Connection:
    from kombu.utils.url import url_to_parts

    _, host, port, user, password, vhost, _ = url_to_parts(url)
    conn = amqp.Connection(
        f"{host}:{port}", userid=user, password=password, virtual_host=vhost, connect_timeout=5
    )
    conn.connect()
    return conn


@pytest.mark.rabbitmq
def test_amqp_url_is_a_fresh_vhost(rabbitmq_server: RabbitServer, amqp_url: str) -> None:
    with _amqp_connect(amqp_url) as conn:
        channel = conn.channel()
        channel.queue_declare("leftover", durable=True, auto_delete=False)
        channel.basic_publish(amqp.Message("x", delivery_mode=2), routing_key="leftover")

    fresh = rabbitmq_server.vhost_url(rabbitmq_server.new_vhost())
    assert fresh != amqp_url
    with _amqp_connect(fresh) as conn:
        with pytest.raises(amqp.exceptions.NotFound):
            conn.channel().queue_declare("leftover", passive=True)
    with pytest.raises(amqp.exceptions.NotAllowed, match="not found"):
        _amqp_connect(amqp_url)  # the earlier vhost is gone


@pytest.mark.rabbitmq
def test_rabbitmq_kill_and_restart_keep_port_and_durable_queues(
    rabbitmq_server: RabbitServer, amqp_url: str
) -> None:
    conn = _amqp_connect(amqp_url)
    channel = conn.channel()
    channel.confirm_select()
    channel.queue_declare("kept", durable=True, auto_delete=False)
    channel.basic_publish_confirm(amqp.Message("x", delivery_mode=2), routing_key="kept")
    port = rabbitmq_server.port

    rabbitmq_server.kill()
    assert not rabbitmq_server.running
    with pytest.raises((OSError, amqp.exceptions.AMQPError)):
        channel.queue_declare("kept", passive=True)

    rabbitmq_server.start()
    assert rabbitmq_server.port == port
    with _amqp_connect(amqp_url) as conn:
        _, count, _ = conn.channel().queue_declare("kept", passive=True)
    assert count == 1

    rabbitmq_server.stop()


@pytest.mark.rabbitmq
def test_rabbitmq_is_running_again_after_a_test_stopped_it(amqp_url: str) -> None:
    # Relies on file order: the test above leaves the server stopped.
    _amqp_connect(amqp_url).close()
