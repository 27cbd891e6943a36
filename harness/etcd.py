"""A three-member etcd cluster on loopback: each member killable and restartable.

Every member is a direct child of the test process in a process group of its own
(see :mod:`harness.servers`), with its data on tmpfs: fsync costs nothing there,
so a busy test machine does not make the cluster miss its Raft heartbeats, and a
killed member still finds its data when it restarts, as after a process crash.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Self

import requests

from .servers import _Server, free_port
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
        reply = requests.post(f"http://{self.endpoint}/v3/maintenance/status", json={}, timeout=2)
        reply.raise_for_status()
        status: dict[str, Any] = reply.json()
        return status

    def _launch(self) -> None:
        url = f"http://127.0.0.1:{self.port}"
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
            ]
        )  # fmt: skip

    def _is_accepting(self) -> bool:
        # /health is true only while the member sees a Raft leader: serving, not just up.
        try:
            reply = requests.get(f"http://{self.endpoint}/health", timeout=0.5)
            return bool(reply.ok and reply.json().get("health") == "true")
        except (requests.RequestException, ValueError):
            return False


class EtcdCluster:
    """Three etcd members; ``url`` names them all, as a celery-leader user would."""

    def __init__(self, size: int = 3) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="celery-leader-etcd-", dir=_DATA_ROOT))
        self.token = uuid.uuid4().hex
        self.members = [EtcdMember(i, self.root, self) for i in range(size)]
        self.initial_cluster = ",".join(
            f"{m.member_name}=http://127.0.0.1:{m.peer_port}" for m in self.members
        )

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(m.endpoint for m in self.members)

    @property
    def running(self) -> bool:
        return all(m.running for m in self.members)

    def start(self) -> None:
        """Start every member that is not running, and wait until all serve."""
        stopped = [m for m in self.members if not m.running]
        for member in stopped:
            member.launch()
        for member in stopped:
            member.wait_ready()

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

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
