"""Real Redis, PostgreSQL, MariaDB and RabbitMQ servers on loopback, one throwaway data
directory each.

All run as direct children of the test process, in a process group of their own, so a
test can stop, kill and restart them on the same port, and a Ctrl-C aimed at pytest does
not shut them down before the fixtures' teardown does.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import amqp
import psycopg
import pymysql
import redis

from .groups import group_alive
from .procs import pid_exists
from .waiting import wait_for

if TYPE_CHECKING:
    # typing.Self is 3.11+; the matrix runs the harness on 3.10 too.
    from typing_extensions import Self

START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
PG_BIN = Path("/usr/lib/postgresql/15/bin")


#: Ports handed out by :func:`free_port`, as ``port:pid`` words, shared by every
#: test process on the machine (``scripts/test.sh`` runs two pytest processes).
PORT_REGISTRY = Path(tempfile.gettempdir()) / "celery-leader-test-ports"


#: A Redis Cluster node listens on its port plus this for the cluster bus.
CLUSTER_BUS_OFFSET = 10000
#: Where ports with a bus are drawn: the kernel hands out ephemeral ports from
#: 32768 (``/proc/sys/net/ipv4/ip_local_port_range``), so a kernel-picked port
#: would put its bus there, where any client connection may hold it by the time
#: the node binds it (seen in CI: "bind: Address already in use" on the bus).
_BUS_PORTS = range(20000, 32768 - CLUSTER_BUS_OFFSET)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(with_bus: bool = False) -> int:
    """A port nothing listens on now, and that no other live test process was given.

    The kernel picks it, so it never collides with 5432. A server keeps its port
    across a restart (its URL is already handed out), so while it is down the
    kernel could give that port to another test process's new server, which
    would then answer in its place: the registry keeps each port reserved for
    as long as the process that took it lives.

    ``with_bus``: ``port + CLUSTER_BUS_OFFSET`` is free and reserved as well (a
    cluster node's bus), both below the ephemeral range. Reserved, not just
    checked: six nodes drawn at random for one cluster picked the same port once
    in about 180 clusters, and the second node's readiness check then reached the
    first node, so the cluster was created on five nodes and never formed.
    """
    with PORT_REGISTRY.open("a+") as registry:
        fcntl.flock(registry, fcntl.LOCK_EX)
        registry.seek(0)
        held: dict[int, int] = {}
        for word in registry.read().split():
            port, _, pid = word.partition(":")
            if port.isdigit() and pid.isdigit() and pid_exists(int(pid)):
                held[int(port)] = int(pid)
        while True:
            if with_bus:
                port = random.choice(_BUS_PORTS)
                taken = {port, port + CLUSTER_BUS_OFFSET}
                if taken.isdisjoint(held) and all(_bindable(p) for p in taken):
                    break
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            taken = {port}
            if port not in held:
                break
        held.update(dict.fromkeys(taken, os.getpid()))
        registry.seek(0)
        registry.truncate()
        registry.write(" ".join(f"{p}:{pid}" for p, pid in held.items()))
    return port


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` of a server's log, for a failure message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


class _Scoped:
    """``with`` for whatever has ``start()`` and ``close()``: a server, or a set of them."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        """Start; the ``with`` block's end stops it and removes its data, even on failure."""
        try:
            self.start()
        except BaseException:
            # A half-started server (or cluster) holds processes and files already.
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Server(_Scoped):
    """Process bookkeeping shared by all servers; subclasses say how to start and stop."""

    name = "server"
    start_timeout = START_TIMEOUT
    _graceful_signal = signal.SIGTERM

    def __init__(self, prefix: str, with_bus: bool = False) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self.log_path = self.root / f"{self.name}.log"
        self.port = free_port(with_bus)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running on port {self.port}")
        self._launch()
        wait_for(
            self._ready,
            self.start_timeout,
            interval=0.05,
            message=lambda: (
                f"{self.name} on port {self.port} did not accept connections; "
                f"log {self.log_path}:\n{tail(self.log_path)}"
            ),
        )

    def stop(self) -> None:
        """Graceful shutdown; clients see their connections closed."""
        self._signal_and_reap(self._graceful_signal)

    def kill(self) -> None:
        """SIGKILL the server and every process it forked, as a machine crash would."""
        self._signal_and_reap(signal.SIGKILL)

    def close(self) -> None:
        if self.running:
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _launch(self) -> None:
        raise NotImplementedError

    def _is_accepting(self) -> bool:
        raise NotImplementedError

    def _popen(
        self, argv: list[str], user: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
                user=user,
                group=user,
                extra_groups=None if user is None else [],
                env=env,
            )

    def _ready(self) -> bool:
        if self._proc is None or self._proc.poll() is not None:
            raise AssertionError(
                f"{self.name} exited while starting; log {self.log_path}:\n{tail(self.log_path)}"
            )
        return self._is_accepting()

    def _signal_and_reap(self, sig: signal.Signals) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # PostgreSQL backends outlive a killed postmaster for a moment; a restart before
        # they are gone fails because they still hold the old shared memory.
        wait_for(
            # Zombies aside (group_alive): they hold no sockets or shared memory, and
            # whether they are ever reaped depends on what PID 1 is on this machine.
            lambda: not group_alive(proc.pid),
            STOP_TIMEOUT,
            message=f"processes of {self.name} group {proc.pid} still alive",
        )


class RedisServer(_Server):
    """redis-server with no persistence: every start, restarts included, begins empty."""

    name = "redis"

    def __init__(self, *extra_args: str) -> None:
        super().__init__("celery-leader-redis-", with_bus="--cluster-enabled" in extra_args)
        #: More redis-server options (cluster mode, a unix socket, TLS ...).
        self.extra_args = list(extra_args)
        #: The server's environment (``None``: this process's), e.g. a shifted clock.
        self.env: dict[str, str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis[Any]:
        return redis.Redis.from_url(self.url, **kwargs)

    def commandstats(self) -> dict[str, int]:
        """Calls per command since start or reset_stats(), e.g. {"set": 3, "client|setinfo": 2}."""
        with self.client() as client:
            stats = client.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}

    def reset_stats(self) -> None:
        with self.client() as client:
            client.config_resetstat()

    def _launch(self) -> None:
        self._popen(
            [
                "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.root),
                "--daemonize", "no",
                *self.extra_args,
            ],
            env=self.env,
        )  # fmt: skip

    def _is_accepting(self) -> bool:
        try:
            with redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5) as c:
                return bool(c.ping())
        except redis.ConnectionError:
            return False


class PostgresServer(_Server):
    """A PostgreSQL 15 cluster with a non-superuser role ``leader`` owning database ``leader``.

    PostgreSQL refuses to run as root, so when the tests run as root every server process
    is started as the ``postgres`` user (subprocess ``user=``, not pg_ctl or runuser, so
    that the postmaster stays our child and can be reaped and SIGKILLed as a group).
    """

    name = "postgres"
    user = "leader"
    password = "leaderpw"
    superuser_password = "postgrespw"
    # SIGINT is PostgreSQL's "fast" shutdown; SIGTERM ("smart") would wait for clients.
    _graceful_signal = signal.SIGINT

    def __init__(self) -> None:
        super().__init__("celery-leader-pg-")
        self.data_dir = self.root / "data"
        self.socket_dir = self.root / "sockets"
        # Only root has to (and can) switch users; anyone else runs PostgreSQL as themselves.
        self._os_user = "postgres" if os.geteuid() == 0 else None
        self._chown(self.root)
        self._initialized = False

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.user}"

    @property
    def superuser_url(self) -> str:
        return f"postgresql://postgres:{self.superuser_password}@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        if not self._initialized:
            self._initdb()
        super().start()
        if not self._initialized:
            with psycopg.connect(self.superuser_url, autocommit=True) as conn:
                conn.execute(f"CREATE ROLE {self.user} LOGIN PASSWORD '{self.password}'")
                conn.execute(f"CREATE DATABASE {self.user} OWNER {self.user}")
            self._initialized = True

    def reset(self) -> None:
        """Fresh logical state: end every ``leader`` session (releasing its advisory locks)
        and drop every object the role created in its database."""
        superuser_leader_db = self.superuser_url.rsplit("/", 1)[0] + f"/{self.user}"
        with psycopg.connect(superuser_leader_db, autocommit=True) as conn:
            # The timeout argument makes the call wait until each backend has exited.
            conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE usename = %s AND pid <> pg_backend_pid()",
                (self.user,),
            )
            conn.execute(f"DROP OWNED BY {self.user}")

    def _chown(self, path: Path) -> None:
        if self._os_user is not None:
            shutil.chown(path, self._os_user, self._os_user)

    def _run_as_owner(self, argv: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL tool (initdb, pg_basebackup) to its end as the server's OS user,
        output captured: what it writes in the data directory must be the server's own."""
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            user=self._os_user,
            group=self._os_user,
            extra_groups=None if self._os_user is None else [],
            **options,
        )

    def _initdb(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.superuser_password + "\n")
        self._chown(pwfile)
        self.socket_dir.mkdir(exist_ok=True)
        self._chown(self.socket_dir)
        result = self._run_as_owner(
            [
                str(PG_BIN / "initdb"),
                "-D", str(self.data_dir),
                "-U", "postgres",
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            cwd=self.root,
        )  # fmt: skip
        pwfile.unlink()
        if result.returncode != 0:
            raise RuntimeError(
                f"initdb failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            )

    def _launch(self) -> None:
        self._popen(
            [
                str(PG_BIN / "postgres"),
                "-D", str(self.data_dir),
                "-p", str(self.port),
                "-k", str(self.socket_dir),
                "-c", "listen_addresses=127.0.0.1",
                # Durability across an OS crash is not what these tests are about; a
                # killed server still recovers from its WAL, which the OS keeps.
                "-c", "fsync=off",
                "-c", "synchronous_commit=off",
                "-c", "full_page_writes=off",
                # Time and pid on each line: a shutdown request or an ended session in
                # a failed test's log (tests/conftest.py shows it) says who and when.
                "-c", "log_line_prefix=%m [%p] ",
            ],
            user=self._os_user,
        )  # fmt: skip

    def _is_accepting(self) -> bool:
        try:
            with psycopg.connect(self.superuser_url, connect_timeout=1):
                return True
        except psycopg.OperationalError:
            return False


class MariaDbServer(_Server):
    """A MariaDB server (Debian's ``mariadb-server``) with user ``leader`` owning database
    ``leader``.

    As for PostgreSQL, when the tests run as root the server runs as the ``mysql`` user
    (mariadbd refuses root without ``--user``, and ``--user`` would leave the data
    directory root's), started directly so that it stays our child. No binary log and no
    fsync: durability across an OS crash is not what these tests are about.
    """

    name = "mariadb"
    user = "leader"
    password = "leaderpw"
    root_password = "rootpw"

    def __init__(self, *extra_args: str) -> None:
        super().__init__("celery-leader-mariadb-")
        #: More mariadbd options (a Galera switch, replication ...).
        self.extra_args = list(extra_args)
        self.data_dir = self.root / "data"
        self.socket = self.root / "mariadb.sock"
        self._os_user = "mysql" if os.geteuid() == 0 else None
        if self._os_user is not None:
            shutil.chown(self.root, self._os_user, self._os_user)
        self._initialized = False

    @property
    def url(self) -> str:
        return f"mariadb://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.user}"

    def root_connection(self) -> pymysql.Connection[Any]:
        """A connection as the server's ``root`` user (autocommit), for faults and checks."""
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            password=self.root_password,
            autocommit=True,
            connect_timeout=2,
        )

    def start(self) -> None:
        if not self._initialized:
            self._install_db()
        super().start()
        if not self._initialized:
            with self.root_connection() as conn, conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE {self.user}")
                cur.execute(f"CREATE USER '{self.user}'@'%' IDENTIFIED BY '{self.password}'")
                cur.execute(f"GRANT ALL ON {self.user}.* TO '{self.user}'@'%'")
            self._initialized = True

    def reset(self) -> None:
        """Fresh logical state: end every ``leader`` session (releasing its named locks)
        and empty its database (Django's tables included)."""
        with self.root_connection() as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT id FROM information_schema.processlist WHERE user = %s", (self.user,)
            )
            for (thread_id,) in cur.fetchall():
                cur.execute(f"KILL CONNECTION {int(thread_id)}")
            wait_for(
                lambda: not cur.execute(
                    "SELECT 1 FROM information_schema.processlist WHERE user = %s", (self.user,)
                ),
                STOP_TIMEOUT,
                message="killed leader sessions of mariadb did not end",
            )
            # The user's grant names the database, so it outlives the drop.
            cur.execute(f"DROP DATABASE {self.user}")
            cur.execute(f"CREATE DATABASE {self.user}")

    def _install_db(self) -> None:
        result = subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={self.data_dir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                "--innodb-log-file-size=16M",
                *([f"--user={self._os_user}"] if self._os_user else []),
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=self.root,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(
                f"mariadb-install-db failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            )

    def _launch(self) -> None:
        self._popen(
            [
                "/usr/sbin/mariadbd",
                "--no-defaults",
                f"--datadir={self.data_dir}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.socket}",
                f"--pid-file={self.root / 'mariadb.pid'}",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-flush-log-at-trx-commit=2",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--performance-schema=OFF",
                # Set by the first start: the root password the harness connects with.
                f"--init-file={self._init_file()}",
                *self.extra_args,
            ],
            user=self._os_user,
        )  # fmt: skip

    def _init_file(self) -> Path:
        path = self.root / "init.sql"
        path.write_text(
            f"ALTER USER 'root'@'localhost' IDENTIFIED BY '{self.root_password}';\n"
            f"ALTER USER 'root'@'127.0.0.1' IDENTIFIED BY '{self.root_password}';\n"
        )
        if self._os_user is not None:
            shutil.chown(path, self._os_user, self._os_user)
        return path

    def _is_accepting(self) -> bool:
        try:
            with self.root_connection():
                return True
        except pymysql.err.OperationalError:
            return False


RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")


class RabbitServer(_Server):
    """A single RabbitMQ node (no plugins, so no management API) with user ``guest``.

    Every port is picked at random, AMQP and Erlang distribution alike, and the node runs
    its own ``epmd`` on a random port too: the default epmd (4369) is shared by every
    Erlang node on the machine and ``erl`` would start it as a daemon that outlives the
    test session. Mnesia (durable queues, vhosts) survives stop/kill and restart, as on a
    real broker restart.
    """

    name = "rabbitmq"
    # An Erlang VM boots in ~10 s on a loaded two-core machine.
    start_timeout = 90.0
    user = "guest"
    password = "guest"

    def __init__(self) -> None:
        super().__init__("celery-leader-rabbit-")
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.nodename = f"rabbit-{self.port}@localhost"
        self._vhosts = 0
        self._vhost: str | None = None
        (self.root / "enabled_plugins").write_text("[].\n")
        (self.root / "rabbitmq-env.conf").write_text("")
        (self.root / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            # Other agents on a shared machine may fill the disk or memory; a resource
            # alarm would block every publisher and look like a bug in the code under test.
            "disk_free_limit.absolute = 1MB\n"
            "vm_memory_high_watermark.relative = 0.9\n"
        )

    @property
    def url(self) -> str:
        """The default vhost ``/``; tests use ``new_vhost()`` for a clean one."""
        return self.vhost_url("/")

    def vhost_url(self, vhost: str) -> str:
        return f"amqp://{self.user}:{self.password}@127.0.0.1:{self.port}/{quote(vhost, safe='')}"

    def new_vhost(self) -> str:
        """Create an empty vhost that ``guest`` may use and return its name; the vhost
        the previous call made is deleted, with its queues and messages. One
        ``rabbitmqctl eval`` call: each CLI call boots an Erlang VM (~0.6 s)."""
        self._vhosts += 1
        name = f"test-{self._vhosts}"
        drop = self._vhost
        delete = f'rabbit_vhost:delete(<<"{drop}">>, <<"harness">>), ' if drop else ""
        self.ctl(
            "eval",
            f'{delete}ok = rabbit_vhost:add(<<"{name}">>, <<"harness">>), '
            f'rabbit_auth_backend_internal:set_permissions(<<"{self.user}">>, <<"{name}">>, '
            '<<".*">>, <<".*">>, <<".*">>, <<"harness">>).',
        )
        self._vhost = name
        return name

    def ctl(self, *args: str) -> str:
        """Run ``rabbitmqctl`` against this node and return its output."""
        result = subprocess.run(
            [str(RABBIT_BIN / "rabbitmqctl"), "-q", "-n", self.nodename, *args],
            env=self._env(),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            output = result.stdout + result.stderr
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed:\n{output}")
        return result.stdout

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            # The Erlang cookie lives in $HOME; the node and rabbitmqctl must share it.
            "HOME": str(self.root),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq.conf"),
            # Without these the node would read /etc/rabbitmq and /var/lib/rabbitmq.
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(self.root / "plugins-expand"),
            "RABBITMQ_PID_FILE": str(self.root / "rabbitmq.pid"),
            "RABBITMQ_LOG_BASE": str(self.root / "log"),
            # Log to stdout, which _popen sends to log_path, so start failures show it.
            "RABBITMQ_LOGS": "-",
        }

    def _launch(self) -> None:
        # epmd in the foreground, in the server's process group, so stop/kill end it too.
        script = (
            f"epmd -port {self.epmd_port} -address 127.0.0.1 & "
            f"exec {RABBIT_BIN / 'rabbitmq-server'}"
        )
        self._popen(["sh", "-c", script], env=self._env())

    def _is_accepting(self) -> bool:
        # A full AMQP handshake: the listener opens only once the node has booted.
        conn = amqp.Connection(
            f"127.0.0.1:{self.port}",
            userid=self.user,
            password=self.password,
            connect_timeout=0.5,
        )
        try:
            conn.connect()
        except (OSError, amqp.exceptions.AMQPError):
            return False
        conn.close()
        return True
