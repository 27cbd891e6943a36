"""A PostgreSQL primary and one streaming standby whose link runs through a TCP proxy.

Held, the proxy stalls replication while both servers stay up: a synchronous
primary then blocks every commit, an asynchronous one keeps committing what the
standby never gets. The standby is named ``standby1`` (its
``application_name``), which is what ``synchronous_standby_names`` lists.
"""

from __future__ import annotations

import os

import psycopg

from .proxy import TcpProxy
from .servers import PG_BIN, PostgresServer
from .waiting import wait_for

STANDBY_NAME = "standby1"


class _Configured(PostgresServer):
    """A PostgresServer started with more ``-c name=value`` settings."""

    def __init__(self, **settings: str) -> None:
        super().__init__()
        self.settings = settings

    def _popen(self, argv: list[str], user: str | None = None) -> None:
        extra = [arg for name, value in self.settings.items() for arg in ("-c", f"{name}={value}")]
        super()._popen([*argv, *extra], user)


class _Standby(PostgresServer):
    """A copy of ``primary`` (pg_basebackup) that streams from it through ``port``."""

    def __init__(self, primary: PostgresServer, port: int) -> None:
        super().__init__()
        self.primary = primary
        self.upstream_port = port

    def start(self) -> None:
        if not self._initialized:
            self._base_backup()
            self._initialized = True
        super().start()

    def _base_backup(self) -> None:
        self.socket_dir.mkdir(exist_ok=True)
        self._chown(self.socket_dir)
        env = {**os.environ, "PGPASSWORD": self.superuser_password}
        result = self._run_as_owner(
            [
                str(PG_BIN / "pg_basebackup"),
                "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                "-D", str(self.data_dir), "-X", "stream", "--no-sync", "--checkpoint=fast",
            ],
            env=env,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed:\n{result.stdout}{result.stderr}")
        conninfo = (
            f"host=127.0.0.1 port={self.upstream_port} user=postgres "
            f"password={self.superuser_password} application_name={STANDBY_NAME}"
        )
        with (self.data_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = '{conninfo}'\n")
        (self.data_dir / "standby.signal").touch()
        self._chown(self.data_dir / "standby.signal")


class PrimaryAndStandby:
    """Primary (synchronous or not) + standby through :attr:`link`.

    ``synchronous`` puts the standby in the primary's
    ``synchronous_standby_names`` (on its command line only, so the promoted
    standby does not wait for a standby of its own). ``proxied=False`` links
    the standby directly, for measuring what replication costs.
    """

    def __init__(self, synchronous: bool, proxied: bool = True) -> None:
        settings = {"synchronous_standby_names": STANDBY_NAME} if synchronous else {}
        self.primary = _Configured(**settings)
        self.link = TcpProxy("127.0.0.1", self.primary.port)
        port = self.link.port if proxied else self.primary.port
        self.standby = _Standby(self.primary, port)
        self.synchronous = synchronous

    @property
    def url(self) -> str:
        """Both servers; libpq connects to whichever accepts writes."""
        p = self.primary
        return (
            f"postgresql://{p.user}:{p.password}@127.0.0.1:{p.port},127.0.0.1:{self.standby.port}"
            f"/{p.user}?target_session_attrs=read-write"
        )

    def start(self) -> None:
        self.primary.start()
        self.standby.start()
        state = "sync" if self.synchronous else "async"
        wait_for(
            lambda: self._replication() == ("streaming", state),
            30,
            interval=0.1,
            message=lambda: f"standby not streaming ({state}): {self._replication()}",
        )

    def _replication(self) -> tuple[str, str] | None:
        with psycopg.connect(self.primary.superuser_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            ).fetchone()
        return (row[0], row[1]) if row else None

    def promote(self) -> None:
        """Promote the standby and wait until it accepts writes."""
        with psycopg.connect(self.standby.superuser_url, autocommit=True) as conn:
            conn.execute("SELECT pg_promote(wait => true)")

    def close(self) -> None:
        self.standby.close()
        self.link.close()
        self.primary.close()
