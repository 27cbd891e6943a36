"""A Redis master, one replica whose replication link runs through a TCP proxy, and Sentinels.

The proxy is what lets a test stall replication without either server noticing:
held, the replica stays "online" in the master's eyes (its link is open, just
silent), so the master keeps accepting writes the replica never gets, which is
the window in which a fail-over loses data.
"""

from __future__ import annotations

import redis

from .clock_shift import shifted_env
from .proxy import TcpProxy
from .servers import RedisServer, _Scoped
from .waiting import wait_for

#: Sentinels call a master down after this long without an answer.
DOWN_AFTER_MS = 500
#: No full-sync delay: a replica is online within a moment of starting.
_FAST_SYNC = ("--repl-diskless-sync-delay", "0")


class SentinelServer(RedisServer):
    """``redis-server sentinel.conf --sentinel`` monitoring ``mymaster``."""

    name = "sentinel"

    def __init__(self, master_port: int, quorum: int) -> None:
        super().__init__()
        self.conf = self.root / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.root}\n"
            f"sentinel monitor mymaster 127.0.0.1 {master_port} {quorum}\n"
            f"sentinel down-after-milliseconds mymaster {DOWN_AFTER_MS}\n"
            # Also how long Sentinel leaves a replica replicating from an address
            # other than the master's (ours: the proxy) before it "fixes" it to
            # the master's own, which would bypass the proxy.
            "sentinel failover-timeout mymaster 120000\n"
        )

    def _launch(self) -> None:
        self._popen(["redis-server", str(self.conf), "--sentinel"])

    def master_port(self) -> int | None:
        """Port of the master this sentinel names now."""
        with self.client(decode_responses=True) as client:
            try:
                address = client.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster")
            except redis.RedisError:
                return None
        return int(address[1]) if address else None


class ReplicatedRedis(_Scoped):
    """Master + replica (linked through :attr:`link`) + three sentinels, quorum two.

    ``with`` starts all of it (sentinels included) and closes it at the end.

    ``replica_clock_shift``: seconds the replica's wall clock runs ahead of the
    host's (behind, when negative), as on a host whose clock is off.
    """

    def __init__(self, replica_clock_shift: float = 0.0) -> None:
        self.master = RedisServer(*_FAST_SYNC)
        self.replica = RedisServer(*_FAST_SYNC)
        if replica_clock_shift:
            self.replica.env = shifted_env(replica_clock_shift)
        self.link: TcpProxy | None = None
        self.sentinels = [SentinelServer(self.master.port, 2) for _ in range(3)]

    @property
    def sentinel_url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/mymaster/0"

    def start(self, sentinels: bool = True) -> None:
        """Master, then the replica through the proxy (online), then the sentinels (ready)."""
        self.master.start()
        self.link = TcpProxy("127.0.0.1", self.master.port)
        self.replica.extra_args += ["--replicaof", "127.0.0.1", str(self.link.port)]
        self.replica.start()
        wait_for(lambda: self.online_replicas() == 1, 20, message="the replica never came online")
        if sentinels:
            for sentinel in self.sentinels:
                sentinel.start()
            wait_for(self._sentinels_ready, 20, interval=0.1, message="sentinels not ready")

    def online_replicas(self) -> int:
        with self.master.client() as client:
            return len(client.execute_command("ROLE")[2])

    def wait_synced(self, timeout: float = 10) -> None:
        """Until the replica has acknowledged everything the master has written."""

        def synced() -> bool:
            with self.master.client() as client:
                _, offset, replicas = client.execute_command("ROLE")
            return bool(replicas) and int(replicas[0][2]) >= offset

        wait_for(synced, timeout, message="the replica did not catch up")

    def _sentinels_ready(self) -> bool:
        for sentinel in self.sentinels:
            with sentinel.client(decode_responses=True) as client:
                info = client.sentinel_master("mymaster")
                if int(info["num-slaves"]) != 1 or int(info["num-other-sentinels"]) != 2:
                    return False
        return True

    def wait_promoted(self, timeout: float = 20) -> None:
        """Until the sentinels name the replica master and it acts as one."""

        def promoted() -> bool:
            if any(s.master_port() != self.replica.port for s in self.sentinels):
                return False
            with self.replica.client() as client:
                return bool(client.execute_command("ROLE")[0] == b"master")

        wait_for(promoted, timeout, interval=0.05, message="the replica was not promoted")

    def close(self) -> None:
        for sentinel in self.sentinels:
            sentinel.close()
        if self.link is not None:
            self.link.close()
        self.replica.close()
        self.master.close()
