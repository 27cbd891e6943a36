"""The Dramatiq quickstart: three replicas, one scheduler, the leader killed twice.

Run with ``bash scripts/quickstart.sh --dramatiq``. It starts its own
``redis-server`` (broker on db 0, lease store on db 1) and three replicas of
``dramatiq dramatiq_app -p 2`` whose schedulers run embedded. It prints who
leads, every slot the workers ran with its epoch, then SIGKILLs the leading
replica (the lease runs out after the ttl) and later SIGTERMs the next leader
(it hands over at once), and ends with the tally "N slots, 0 sent twice". A
slot counts as sent twice when two different messages carry it. Exit status 0
when nothing was sent twice and both hand-overs happened.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from celery_leader.backends import open_store
from celery_leader.settings.config import LeaderConfig

HERE = Path(__file__).resolve().parent


#: Seconds the replicas may take to start and elect a leader whose slot a worker ran:
#: about 6 s on two busy cores (Dramatiq with 2 processes of 2 threads each, three times).
STARTUP = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data = Path(tempfile.mkdtemp(prefix="celery-leader-dramatiq-"))
        self.port = free_port()
        self.ledger = self.data / "ledger"
        self.env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent)]),
            DEMO_BROKER_URL=f"redis://127.0.0.1:{self.port}/0",
            DEMO_EVERY=str(args.every),
            DEMO_LEDGER=str(self.ledger),
            CELERY_LEADER_URL=f"redis://127.0.0.1:{self.port}/1",
            CELERY_LEADER_TTL=str(args.ttl),
        )
        self.config = LeaderConfig.from_env(self.env)
        self.store = open_store(self.config)
        self.t0 = time.monotonic()
        self.redis: subprocess.Popen[bytes] | None = None
        self.replicas: list[subprocess.Popen[bytes]] = []
        self.seen = 0
        self.slots: dict[str, set[str]] = defaultdict(set)  # slot -> message ids
        self.epochs: list[int] = []
        self.leader: tuple[str, int] | None = None

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.2f} s] {text}", flush=True)

    # -- processes -----------------------------------------------------------

    def start_redis(self) -> None:
        self.redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.data),
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                self.say(f"redis-server on port {self.port} (broker db 0, lease store db 1)")
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("redis-server did not start")

    def spawn(self) -> subprocess.Popen[bytes]:
        n = len(self.replicas)
        log = (self.data / f"replica{n}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "dramatiq_app", "-p", "2", "-t", "2"],
            cwd=HERE,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.replicas.append(proc)
        self.say(f"replica {n} started (dramatiq pid {proc.pid}), log {log.name}")
        return proc

    def replica_of(self, pid: int) -> subprocess.Popen[bytes] | None:
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return None
        return next((p for p in self.replicas if p.pid == group and p.poll() is None), None)

    # -- observing -----------------------------------------------------------

    def poll(self) -> None:
        holder = self.store.lock.holder(self.config.beat_election)
        now = None if holder is None else (holder.instance_id, holder.epoch)
        if now != self.leader:
            self.leader = now
            self.say("nobody leads" if now is None else f"leader: {now[0]} (epoch {now[1]})")
        if not self.ledger.exists():
            return
        lines = self.ledger.read_text().splitlines()
        for line in lines[self.seen :]:
            run = json.loads(line)
            self.slots[run["slot"]].add(run["message_id"])
            self.epochs.append(run["epoch"])
            self.say(f"ran {run['slot']} epoch {run['epoch']} (worker pid {run['pid']})")
        self.seen = len(lines)

    def wait_for_leader(self, timeout: float) -> bool:
        """Until a replica leads and a worker ran a slot of its term (False after ``timeout``
        seconds: the replicas start slower on a busy machine than any fixed wait allows)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.poll()
            if self.leader is not None and self.epochs and self.epochs[-1] == self.leader[1]:
                return True
            time.sleep(0.05)
        self.say(f"no replica led and ran a slot within {timeout:g} s")
        return False

    def run_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.poll()
            time.sleep(0.05)

    def hand_over(self, sig: signal.Signals) -> float | None:
        """Signal the leading replica's process group; seconds until a new term sends."""
        self.poll()
        if self.leader is None:
            return None
        pid = int(self.leader[0].rpartition(":")[2])
        replica, old_epoch = self.replica_of(pid), self.leader[1]
        if replica is None:
            return None
        self.say(f"sending {sig.name} to the leader's replica (process group {replica.pid})")
        fault = time.monotonic()
        os.killpg(replica.pid, sig)
        deadline = fault + self.args.ttl + 10
        elected = None
        while time.monotonic() < deadline:
            self.poll()
            if elected is None and self.leader is not None and self.leader[1] > old_epoch:
                elected = time.monotonic() - fault
            if elected is not None and self.epochs and self.epochs[-1] > old_epoch:
                self.say(
                    f"new leader elected after {elected:.2f} s; its first slot ran "
                    f"{time.monotonic() - fault:.2f} s after the {sig.name}"
                )
                self.spawn()
                return elected
            time.sleep(0.02)
        return None

    def stop(self) -> None:
        for proc in self.replicas:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.replicas:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.store.close()
        if self.redis is not None:
            os.killpg(self.redis.pid, signal.SIGKILL)
            self.redis.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ttl", type=float, default=3.0, help="lease ttl in seconds (3)")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between slots (0.5)")
    parser.add_argument("--short", action="store_true", help="shorter steady phases")
    args = parser.parse_args()
    steady = 2.0 if args.short else 4.0
    demo = Demo(args)
    killed = termed = None
    try:
        demo.start_redis()
        for _ in range(3):
            demo.spawn()
        if demo.wait_for_leader(STARTUP):
            demo.run_for(steady)
            killed = demo.hand_over(signal.SIGKILL)
            demo.run_for(steady)
            termed = demo.hand_over(signal.SIGTERM)
            demo.run_for(steady)
    finally:
        demo.stop()
    twice = sorted(slot for slot, ids in demo.slots.items() if len(ids) > 1)
    print(
        f"hand-over after SIGKILL: {killed if killed is None else f'{killed:.2f} s'} "
        f"(ttl {args.ttl:g} s); after SIGTERM: {termed if termed is None else f'{termed:.2f} s'}"
    )
    print(f"{len(demo.slots)} slots, {len(twice)} sent twice")
    if twice:
        print("sent twice:", ", ".join(twice))
    return 0 if not twice and killed is not None and termed is not None else 1


if __name__ == "__main__":
    sys.exit(main())
