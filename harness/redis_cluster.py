"""A Redis Cluster of three masters, each with one replica, and the faults of a fail-over.

Every node is a redis-server on loopback. Only an operator promotes here
(``cluster-replica-no-failover``): a test decides when a replica takes over
with ``CLUSTER FAILOVER TAKEOVER``, which promotes it without asking its
master or the other masters, as an operator does when the master is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import redis
from redis.crc import key_slot

from .servers import RedisServer, tail
from .waiting import wait_for

#: A node that stops answering is flagged failing after this long; only an
#: operator promotes, so it decides nothing here but what the nodes report.
NODE_TIMEOUT_MS = 2000
#: No full-sync delay: a replica is online within a moment of starting.
_FAST_SYNC = ("--repl-diskless-sync-delay", "0")


class ClusterNode(RedisServer):
    """A redis-server in cluster mode (its port and its bus port reserved by ``free_port``)."""

    def __init__(self) -> None:
        super().__init__(
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--cluster-replica-no-failover", "yes",
            *_FAST_SYNC,
        )  # fmt: skip
        self.paused = False

    def command(self, *args: Any, timeout: float = 5) -> Any:
        """One command on a fresh connection (decoded replies)."""
        with redis.Redis(port=self.port, socket_timeout=timeout, decode_responses=True) as client:
            return client.execute_command(*args)

    def node_id(self) -> str:
        return str(self.command("CLUSTER", "MYID"))

    def role(self) -> str:
        """``master`` or ``slave``, as ``ROLE`` says."""
        return str(self.command("ROLE")[0])

    def pause(self) -> None:
        """SIGSTOP: the replica stops reading, its link stays open (the master lists it online)."""
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGCONT)
        self.paused = False

    def close(self) -> None:
        if self.paused and self.running:
            self.resume()  # a stopped process would hold the SIGTERM until then
        super().close()


class Cluster3x3:
    """Three masters and three replicas, one replica per master."""

    def __init__(self) -> None:
        self.nodes = [ClusterNode() for _ in range(6)]

    @property
    def url(self) -> str:
        """A ``?cluster=true`` URL naming one seed node, as a user's setting would."""
        return f"redis://127.0.0.1:{self.nodes[0].port}/0?cluster=true"

    def start(self) -> None:
        """Every node, the cluster created, and each replica online on its master."""
        for node in self.nodes:
            node.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create"]
            + [f"127.0.0.1:{n.port}" for n in self.nodes]
            + ["--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        wait_for(self._formed, 30, interval=0.1, message=self._unformed)

    def _formed(self) -> bool:
        try:
            if any(n.command("CLUSTER", "INFO").find("cluster_state:ok") < 0 for n in self.nodes):
                return False
            masters = [n for n in self.nodes if n.role() == "master"]
            # A write each replica acknowledges: listed online is not yet synced.
            return len(masters) == 3 and all(self._replicated(m) for m in masters)
        except redis.RedisError:
            return False

    def _unformed(self) -> str:
        """What each node says of the cluster, and the end of its log: which wait failed."""
        lines = ["the cluster never formed"]
        for node in self.nodes:
            try:
                info = node.command("CLUSTER", "INFO", timeout=1)
                wanted = ("cluster_state", "cluster_known")
                state = " ".join(row for row in info.split() if row.startswith(wanted))
                role = node.command("ROLE", timeout=1)
                said = f"{state} role {role}"
            except redis.RedisError as exc:
                said = f"unreachable: {exc!r}"
            lines += [f"node {node.port} (running: {node.running}): {said}", tail(node.log_path, 8)]
        return "\n".join(lines)

    def _replicated(self, master: ClusterNode) -> bool:
        """True when ``master``'s replica acknowledges a write within 0.1 s."""
        ranges = [
            (int(s[0]), int(s[1]))
            for s in master.command("CLUSTER", "SLOTS")
            if int(s[2][1]) == master.port
        ]
        if not ranges:
            return False  # its own slots not in its map yet
        start, end = ranges[0]
        key = next(
            f"probe{n}" for n in range(1 << 20) if start <= key_slot(f"probe{n}".encode()) <= end
        )
        with redis.Redis(port=master.port, socket_timeout=5) as client:
            client.incr(key)
            return int(client.execute_command("WAIT", 1, 100)) == 1

    def master_of(self, key: str) -> ClusterNode:
        """The master that serves ``key``'s hash slot, by the cluster's own map."""
        for node in self.nodes:
            if not node.running or node.paused:
                continue
            try:
                slot = int(node.command("CLUSTER", "KEYSLOT", key))
                shards = node.command("CLUSTER", "SLOTS")
            except redis.RedisError:
                continue
            for start, end, master, *_ in shards:
                if int(start) <= slot <= int(end):
                    return self._by_port(int(master[1]))
        raise AssertionError(f"no live node knows who serves {key!r}")

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        """The replica that replicates from ``master`` (``ROLE`` lists it online)."""
        (replica,) = master.command("ROLE")[2]
        return self._by_port(int(replica[1]))

    def _by_port(self, port: int) -> ClusterNode:
        return next(n for n in self.nodes if n.port == port)

    def wait_synced(self, master: ClusterNode, timeout: float = 10) -> None:
        """Until ``master``'s replica has acknowledged everything it wrote."""

        def synced() -> bool:
            _, offset, replicas = master.command("ROLE")
            return bool(replicas) and int(replicas[0][2]) >= int(offset)

        wait_for(synced, timeout, interval=0.02, message="the replica did not catch up")

    def write_behind(self, master: ClusterNode, key: str, megabytes: int) -> None:
        """Write ``megabytes`` MB to ``master`` under ``key``'s hash tag: its replica's backlog."""
        tag = key[key.index("{") : key.index("}") + 1]
        chunk = "x" * (1 << 20)
        with redis.Redis(port=master.port, socket_timeout=30) as client:
            pipe = client.pipeline(transaction=False)
            for n in range(megabytes):
                pipe.set(f"{tag}:ballast:{n}", chunk)
            pipe.execute()

    def wait_failed(self, node: ClusterNode, timeout: float) -> None:
        """Until the other live nodes flag ``node`` failed (``fail`` in ``CLUSTER NODES``)."""
        node_id = node.node_id() if not node.paused else self._id_by_port(node.port)

        def flagged() -> bool:
            for other in self.nodes:
                if other is node or not other.running or other.paused:
                    continue
                for line in other.command("CLUSTER", "NODES").splitlines():
                    row = line.split()
                    if row[0] == node_id and "fail" not in row[2].split(","):
                        return False
            return True

        wait_for(flagged, timeout, interval=0.05, message=f"node {node.port} not flagged failed")

    def _id_by_port(self, port: int) -> str:
        for other in self.nodes:
            if other.port == port or not other.running or other.paused:
                continue
            for line in other.command("CLUSTER", "NODES").splitlines():
                row = line.split()
                if row[1].split("@")[0].endswith(f":{port}"):
                    return row[0]
        raise AssertionError(f"no live node knows a node on port {port}")

    def cut_replica_link(self, master: ClusterNode, replica: ClusterNode) -> None:
        """Cut ``replica``'s replication link for good, while both keep running.

        The master closes it (``CLIENT KILL TYPE replica``), and the replica's
        next handshakes authenticate as a user the master does not have, so it
        cannot reconnect: the master lists no replica, the cluster still lists
        it (its bus is untouched), and ``TAKEOVER`` can promote it.
        """
        replica.command("CONFIG", "SET", "masteruser", "cut-off", "masterauth", "cut-off")
        master.command("CLIENT", "KILL", "TYPE", "replica")
        wait_for(
            lambda: not master.command("ROLE")[2], 5, interval=0.01, message="the link stayed up"
        )

    def move_slot(self, key: str, target: ClusterNode, timeout: float = 10) -> None:
        """Migrate ``key``'s hash slot, keys included, to the master ``target``, as
        ``redis-cli --cluster reshard`` does; returns once every live master maps it there."""
        source = self.master_of(key)
        slot = int(source.command("CLUSTER", "KEYSLOT", key))
        target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id())
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id())
        while keys := source.command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            source.command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        masters = [n for n in self.nodes if n.running and not n.paused and n.role() == "master"]
        for node in masters:
            node.command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id())
        wait_for(
            lambda: all(self._owner(n, slot) == target.port for n in masters),
            timeout,
            interval=0.01,
            message=f"slot {slot} not moved",
        )

    @staticmethod
    def _owner(node: ClusterNode, slot: int) -> int | None:
        """Port of the master ``node`` maps ``slot`` to."""
        for start, end, master, *_ in node.command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return int(master[1])
        return None

    def take_over(self, replica: ClusterNode, timeout: float = 10) -> None:
        """Promote ``replica`` with ``CLUSTER FAILOVER TAKEOVER``; returns once it acts as a
        master and the other live masters map its slots to it."""
        replica.command("CLUSTER", "FAILOVER", "TAKEOVER")

        def promoted() -> bool:
            if replica.role() != "master":
                return False
            for node in self.nodes:
                if node is replica or not node.running or node.paused:
                    continue
                ports = {int(s[2][1]) for s in node.command("CLUSTER", "SLOTS")}
                if replica.port not in ports:
                    return False
            return True

        wait_for(promoted, timeout, interval=0.01, message="the replica was not promoted")

    def close(self) -> None:
        for node in self.nodes:
            node.close()
