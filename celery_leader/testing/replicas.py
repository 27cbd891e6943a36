"""Real ``celery beat`` replicas against one lease store, for an integration test: each a
process of its own (``python -m celery_leader.testing.beat_replica``), noting what it
published in a ledger file; by default the broker is Celery's filesystem transport."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.urls import scheme_of

#: How long replicas get to start beat (importing Celery and the app), and to
#: exit after SIGTERM: generous, because test machines run many tests at once.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


@dataclass
class BeatReplicas:
    """The running replicas: ``procs`` by name (``beat-1``, ...), their files in ``workdir``."""

    workdir: Path
    procs: dict[str, subprocess.Popen[bytes]]

    def sent(self) -> dict[str, list[str]]:
        """Replica name -> the ``leader_slot`` of each message it published, in order
        (``""`` without the header); readable while the replicas run and after."""
        return {
            name: [r["slot"] or "" for r in self._records(name) if "slot" in r]
            for name in self.procs
        }

    def log(self, name: str) -> str:
        """What replica ``name`` printed (beat's log at INFO), for a failing test's message."""
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def _records(self, name: str) -> list[dict[str, Any]]:
        path = self.workdir / f"{name}.jsonl"
        if not path.exists():
            return []
        lines = path.read_text().splitlines(keepends=True)
        # A line without its newline is still being written.
        return [json.loads(line) for line in lines if line.endswith("\n")]

    def _ready(self, name: str) -> bool:
        return any(r.get("ready") for r in self._records(name))


@contextmanager
def beat_replicas(
    app: str,
    count: int = 3,
    *,
    leader_url: str,
    workdir: Path,
    broker_url: str | None = None,
    settings: Mapping[str, Any] | None = None,
) -> Iterator[BeatReplicas]:
    """Run ``count`` beat replicas of ``app`` (as for ``celery -A``) until the block ends.

    Every replica uses ``leader_url`` (a ``file://`` or a server's URL: ``memory://`` is
    private to each process, so every replica would lead) and ``broker_url``, else Celery's
    filesystem transport under ``workdir``; then ``settings`` (JSON values). Each replica's
    ``leader_instance_id`` is its name. The block starts once every replica started beat;
    at its end each gets SIGTERM and is waited for.
    """
    if count < 1:
        raise ValueError(f"beat_replicas: count must be at least 1 (got {count!r})")
    if scheme_of(leader_url) == "memory":
        # Each process would have a store of its own, and every replica would lead.
        raise ValueError(
            "beat_replicas: a memory:// store is private to one process; give a "
            "file:// directory or a server's URL"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    overrides: dict[str, Any] = {"leader_url": leader_url}
    if broker_url is None:
        folder = workdir / "broker"
        folder.mkdir(exist_ok=True)
        overrides["broker_url"] = "filesystem://"
        transport = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
        overrides["broker_transport_options"] = transport
    else:
        overrides["broker_url"] = broker_url
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    module = [sys.executable, "-m", "celery_leader.testing.beat_replica"]
    replicas = BeatReplicas(workdir, {})
    try:
        for n in range(1, count + 1):
            name = f"beat-{n}"
            replica_settings = {**overrides, **(settings or {}), "leader_instance_id": name}
            argv = [*module, "--ledger", str(workdir / f"{name}.jsonl")]
            argv += ["--settings", json.dumps(replica_settings)]
            argv += ["--schedule", str(workdir / f"{name}.schedule"), app]
            with open(workdir / f"{name}.log", "wb") as log:
                replicas.procs[name] = subprocess.Popen(
                    argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT
                )
        _wait_started(replicas)
        yield replicas
    finally:
        _stop(replicas)


def _wait_started(replicas: BeatReplicas) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    waiting = set(replicas.procs)
    while waiting:
        for name in sorted(waiting):
            if replicas._ready(name):
                waiting.discard(name)
            elif replicas.procs[name].poll() is not None:
                raise RuntimeError(f"beat replica {name} exited early:\n{replicas.log(name)}")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"beat replicas {sorted(waiting)} did not start in {START_TIMEOUT} s"
            )
        time.sleep(0.05)


def _stop(replicas: BeatReplicas) -> None:
    for proc in replicas.procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in replicas.procs.values():
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
