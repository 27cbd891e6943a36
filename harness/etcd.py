"""A three-member etcd cluster on loopback: each member killable and restartable.

Every member is a direct child of the test process in a process group of its own
(see :mod:`harness.servers`), with its data on tmpfs: fsync costs nothing there,
so a busy test machine does not make the cluster miss its Raft heartbeats, and a
killed member still finds its data when it restarts, as after a process crash.
"""

from __future__ import annotations

import base64
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import requests

from .servers import _Scoped, _Server, free_port
from .waiting import wait_for

START_TIMEOUT = 30.0
#: tmpfs when the machine has one (Linux always does).
_DATA_ROOT = "/dev/shm" if Path("/dev/shm").is_dir() else None


class EtcdMember(_Server):
    """One member; ``start()`` after ``kill()`` or ``stop()`` rejoins with its data."""

    name = "etcd"

    def __init__(self, index: int, root: Path, cluster: EtcdCluster) -> None:
        self.index = index
        self.member_name = f"m{index}"
        self._cluster = cluster
        self.peer_port = free_port()
        super().__init__(f"celery-leader-etcd-m{index}-")
        # _Server made a directory of its own; the member lives under the cluster's.
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = root / self.member_name
        self.root.mkdir()
        self.log_path = self.root / "etcd.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The member's process id (and process group), while it runs."""
        return self._proc.pid if self.running and self._proc is not None else None

    def metrics(self) -> dict[str, float]:
        """The member's Prometheus counters, summed over their labels: name -> value."""
        text = requests.get(f"{self.base}/metrics", timeout=5, verify=self._cluster.verify).text
        totals: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                name = name.partition("{")[0]
                totals[name] = totals.get(name, 0.0) + float(value)
        return totals

    @property
    def base(self) -> str:
        """Where the member's client API answers (its gateway is under ``/v3``)."""
        return f"{self._cluster.scheme}://{self.endpoint}"

    def launch(self) -> None:
        """Start the process without waiting: a lone member of a new cluster has no quorum."""
        if self.running:
            raise RuntimeError(f"etcd member {self.member_name} is already running")
        self._launch()

    def wait_ready(self) -> None:
        wait_for(
            self._ready,
            START_TIMEOUT,
            interval=0.05,
            message=lambda: (
                f"etcd member {self.member_name} never became healthy; log {self.log_path}"
            ),
        )

    def status(self) -> dict[str, Any]:
        """The member's ``/v3/maintenance/status`` (its id, and the Raft leader's)."""
        return self._cluster.post(self, "maintenance/status", {})

    def _launch(self) -> None:
        url = self.base
        peer = f"http://127.0.0.1:{self.peer_port}"
        self._popen(
            [
                "etcd",
                "--name", self.member_name,
                "--data-dir", str(self.root / "data"),
                "--listen-client-urls", url,
                "--advertise-client-urls", url,
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", self._cluster.initial_cluster,
                "--initial-cluster-state", "new",
                "--initial-cluster-token", self._cluster.token,
                "--logger", "zap",
                "--log-level", "warn",
                *self._cluster.tls_args,
            ]
        )  # fmt: skip

    def _is_accepting(self) -> bool:
        # /health is true only while the member sees a Raft leader: serving, not just up.
        try:
            reply = requests.get(f"{self.base}/health", timeout=0.5, verify=self._cluster.verify)
            return bool(reply.ok and reply.json().get("health") == "true")
        except (requests.RequestException, ValueError):
            return False


class EtcdCluster(_Scoped):
    """Three etcd members; ``url`` names them all, as a celery-leader user would."""

    def __init__(self, size: int = 3, tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: a certificate and its key, for clients to reach the members with HTTPS."""
        self.scheme = "https" if tls else "http"
        self.verify: str | bool = str(tls[0]) if tls else True
        self.tls_args = ["--cert-file", str(tls[0]), "--key-file", str(tls[1])] if tls else []
        self.root = Path(tempfile.mkdtemp(prefix="celery-leader-etcd-", dir=_DATA_ROOT))
        self.token = uuid.uuid4().hex
        self._auth: dict[str, str] = {}
        self.members = [EtcdMember(i, self.root, self) for i in range(size)]
        self.initial_cluster = ",".join(
            f"{m.member_name}=http://127.0.0.1:{m.peer_port}" for m in self.members
        )

    @property
    def url(self) -> str:
        scheme = "etcds" if self.scheme == "https" else "etcd"
        return f"{scheme}://" + ",".join(m.endpoint for m in self.members)

    def post(self, member: EtcdMember, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One call of the gateway's JSON API on ``member`` (as root, when auth is on)."""
        reply = requests.post(
            f"{member.base}/v3/{path}",
            json=body,
            headers=self._auth,
            timeout=5,
            verify=self.verify,
        )
        reply.raise_for_status()
        result: dict[str, Any] = reply.json()
        return result

    def enable_auth(self, root_password: str, user: str, password: str, prefix: str) -> None:
        """Turn auth on, with ``user`` allowed to read and write keys under ``prefix``."""
        member = self.members[0]
        self.post(member, "auth/user/add", {"name": "root", "password": root_password})
        self.post(member, "auth/role/add", {"name": "root"})
        self.post(member, "auth/user/grant", {"user": "root", "role": "root"})
        self.post(member, "auth/user/add", {"name": user, "password": password})
        self.post(member, "auth/role/add", {"name": "leader"})
        key = base64.b64encode(prefix.encode()).decode()
        end = base64.b64encode(prefix[:-1].encode() + bytes([ord(prefix[-1]) + 1])).decode()
        perm = {"permType": "READWRITE", "key": key, "range_end": end}
        self.post(member, "auth/role/grant", {"name": "leader", "perm": perm})
        self.post(member, "auth/user/grant", {"user": user, "role": "leader"})
        self.post(member, "auth/enable", {})
        token = self.post(member, "auth/authenticate", {"name": "root", "password": root_password})[
            "token"
        ]
        self._auth = {"Authorization": token}

    @property
    def running(self) -> bool:
        return all(m.running for m in self.members)

    def start(self) -> None:
        """Start every member that is not running, and wait until all serve."""
        self.regain_quorum()

    def regain_quorum(self) -> float:
        """:meth:`start`, returning the ``time.monotonic()`` at which the first
        relaunched member was seen serving, i.e. seeing a Raft leader: when a
        cluster that had lost quorum has it back. That can be seconds before the
        last one serves, and etcd itself can take seconds to elect a leader
        after a relaunch.
        """
        stopped = [m for m in self.members if not m.running]
        for member in stopped:
            member.launch()
        wait_for(
            lambda: not stopped or any(m._ready() for m in stopped),
            START_TIMEOUT,
            interval=0.05,
            message=lambda: f"no relaunched etcd member became healthy; logs under {self.root}",
        )
        serving = time.monotonic()
        for member in stopped:
            member.wait_ready()
        return serving

    def lose_quorum(self) -> float:
        """SIGKILL the Raft leader and one more member: no majority until :meth:`start`.

        Returns the ``time.monotonic()`` just before the first kill (finding the
        Raft leader takes requests, which must not count as the outage).
        """
        leader = self.raft_leader()
        other = next(m for m in self.members if m is not leader and m.running)
        killed = time.monotonic()
        leader.kill()
        other.kill()
        return killed

    def raft_leader(self) -> EtcdMember:
        """The member that leads Raft now (asked of the running members)."""

        def ask() -> EtcdMember | None:
            by_id = {}
            leader = None
            for member in self.members:
                if not member.running:
                    continue
                try:
                    status = member.status()
                except requests.RequestException:
                    continue
                by_id[status["header"]["member_id"]] = member
                leader = status.get("leader")
            return by_id.get(leader) if leader else None

        return wait_for(ask, START_TIMEOUT, interval=0.05, message="no etcd member leads Raft")

    def raft_term(self) -> int:
        """The highest Raft term a running member reports: it grows with every election."""
        terms = []
        for member in self.members:
            if member.running:
                try:
                    terms.append(int(member.status()["header"]["raft_term"]))
                except requests.RequestException:
                    continue
        return max(terms, default=0)

    def reset(self) -> None:
        """Delete every key and revoke every lease: each test starts from an empty store."""
        member = next(m for m in self.members if m.running)
        base = f"http://{member.endpoint}/v3"
        requests.post(
            f"{base}/kv/deleterange", json={"key": "AA==", "range_end": "AA=="}, timeout=5
        )
        leases = requests.post(f"{base}/lease/leases", json={}, timeout=5).json()
        for lease in leases.get("leases", []):
            requests.post(f"{base}/kv/lease/revoke", json={"ID": lease["ID"]}, timeout=5)

    def close(self) -> None:
        for member in self.members:
            if member.running:
                member.kill()
        shutil.rmtree(self.root, ignore_errors=True)
