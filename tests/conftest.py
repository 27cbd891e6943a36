"""Fixtures for real servers, processes and network faults.

Servers are session-scoped and start only when a test asks for them; the function-scoped
``redis_url``, ``postgres_url``, ``mariadb_url`` and ``amqp_url`` give every test a running
server with no state left over from earlier tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.etcd import EtcdCluster
from harness.procs import Procs
from harness.proxy import TcpProxy
from harness.servers import MariaDbServer, PostgresServer, RabbitServer, RedisServer, tail

# pytest-celery, when installed, makes ``celery_worker`` a Docker fixture; this plugin
# puts back Celery's own in-process worker fixtures, and nothing here may need Docker.
pytest_plugins = ("celery.contrib.pytest",)

# The example projects of docs/testing.md are separate pytest projects (each has
# its own root conftest.py); tests/test_testing_helpers.py runs them in a subprocess.
collect_ignore = ["projects"]

_SERVER_FIXTURES = (
    "redis_server",
    "postgres_server",
    "mariadb_server",
    "etcd_cluster",
    "rabbitmq_server",
)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    # No skip on failure: a suite that silently skips its PostgreSQL tests looks green.
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDbServer]:
    with MariaDbServer() as server:
        yield server


#: The SQL servers a test was given a URL of: a failure shows the end of their logs.
_USED_SERVERS = pytest.StashKey[list[PostgresServer | MariaDbServer]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[None]:
    """A failed test that used PostgreSQL or MariaDB shows the end of that server's log:
    whether it was sent a shutdown request (a signal from outside the test) or ended
    sessions itself. The log goes with the server's directory at the session's end."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "teardown" or not report.failed:
        return
    for server in item.stash.get(_USED_SERVERS, []):
        title = f"{server.name} log ({server.log_path})"
        report.sections.append((title, tail(server.log_path, 30)))


@pytest.fixture(scope="session")
def etcd_cluster() -> Iterator[EtcdCluster]:
    """Three etcd members on loopback (a test may kill any of them; the next gets them back)."""
    with EtcdCluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def rabbitmq_server() -> Iterator[RabbitServer]:
    with RabbitServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _restart_stopped_servers(request: pytest.FixtureRequest) -> None:
    """A test that stops or kills a session server must not break the tests after it."""
    for name in _SERVER_FIXTURES:
        if name in request.fixturenames:
            server = request.getfixturevalue(name)
            if not server.running:
                server.start()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of a running, empty Redis (data, Lua script cache and command stats cleared)."""
    with redis_server.client() as client:
        client.flushall()
        client.script_flush()
        client.config_resetstat()
    return redis_server.url


@pytest.fixture
def postgres_url(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> str:
    """URL of a running PostgreSQL where role ``leader`` has no sessions and no objects."""
    request.node.stash.setdefault(_USED_SERVERS, []).append(postgres_server)
    postgres_server.reset()
    return postgres_server.url


@pytest.fixture
def mariadb_url(mariadb_server: MariaDbServer, request: pytest.FixtureRequest) -> str:
    """``mariadb://`` URL of a running MariaDB where user ``leader`` has no sessions and
    its database no tables."""
    request.node.stash.setdefault(_USED_SERVERS, []).append(mariadb_server)
    mariadb_server.reset()
    return mariadb_server.url


@pytest.fixture
def etcd_url(etcd_cluster: EtcdCluster) -> str:
    """``etcd://`` URL naming all three members of a serving cluster with no keys and no leases."""
    etcd_cluster.reset()
    return etcd_cluster.url


@pytest.fixture
def amqp_url(rabbitmq_server: RabbitServer) -> str:
    """URL of a running RabbitMQ in a vhost of its own: no queues, exchanges or messages
    from earlier tests (the previous test's vhost is deleted in the same CLI call)."""
    return rabbitmq_server.vhost_url(rabbitmq_server.new_vhost())


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[[str, int], TcpProxy]]:
    """Factory ``tcp_proxy(host, port) -> TcpProxy``; every proxy is closed at teardown."""
    proxies: list[TcpProxy] = []

    def make(target_host: str, target_port: int) -> TcpProxy:
        proxy = TcpProxy(target_host, target_port)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """``procs.spawn_python(...)``; every process group is SIGKILLed at teardown."""
    tracker = Procs(tmp_path)
    yield tracker
    tracker.cleanup()
