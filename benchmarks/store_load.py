"""Store load at scale: many lease holders in many elections against Redis, PostgreSQL and etcd.

``HOLDERS`` leases (each with its own backend, as separate processes would
have) spread over ``ELECTIONS`` elections run in ``PROCESSES`` processes. With
every election led and the followers queued, the store's work is measured over
a window: commands (Redis ``INFO commandstats``), statements
(``pg_stat_statements``) or requests (etcd's ``grpc_server_started_total``,
summed over the three members of a cluster) per second, and the server's CPU
(for etcd, the three members' together). Then the whole fleet is restarted at
once, crashed (SIGKILL) and stopped (SIGTERM), and the time until every election
has a leader from the new fleet is measured.

Run as ``python -m benchmarks.store_load holder URL FIRST COUNT GENERATION`` it is
one of those holder processes: it prints ``elected <election> <time>`` as its
leases win, and on SIGTERM stops them all (each releases what it holds).
``python -m benchmarks.store_load [--quick] [STORE ...]`` runs this benchmark alone
(for the named stores: redis, postgres, mysql, etcd) and prints its table.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from celery_leader.backends import open_store
from celery_leader.election.events import Callbacks
from celery_leader.election.lease import Lease
from celery_leader.settings.config import LeaderConfig
from harness.etcd import EtcdCluster
from harness.groups import group_cpu_seconds, start_child
from harness.servers import MariaDbServer, PostgresServer, RedisServer

HOLDERS = 200
ELECTIONS = 20
PROCESSES = 4
TTL = 3.0
#: A restarted fleet that has not elected every election by then counts as failed.
ELECT_TIMEOUT = 60.0


def holder_main(url: str, first: int, count: int, generation: int) -> None:
    config = LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL})
    out = threading.Lock()

    def elected(lease: Lease) -> None:
        with out:
            print(f"elected {lease.election} {time.time():.6f}", flush=True)

    stores = [open_store(config) for _ in range(count)]
    leases = [
        Lease(
            f"e{i % ELECTIONS}",
            stores[i - first].lock,
            ttl=config.ttl,
            renew_interval=config.renew_interval,
            instance_id=f"g{generation}-h{i}",
            callbacks=Callbacks(on_started=elected),
        )
        for i in range(first, first + count)
    ]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"started {time.time():.6f}", flush=True)
    for lease in leases:
        lease.start()
    stop.wait()
    # In parallel: one by one, each stop would wait for its lease thread in turn.
    stoppers = [threading.Thread(target=lease.stop) for lease in leases]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join()
    for store in stores:
        store.close()


class Fleet:
    """One generation of holder processes."""

    def __init__(self, url: str, generation: int, workdir: Path) -> None:
        per = HOLDERS // PROCESSES
        self.children = []
        for p in range(PROCESSES):
            argv = [sys.executable, "-m", "benchmarks.store_load", "holder", url]
            argv += [str(p * per), str(per), str(generation)]
            self.children.append(
                start_child(argv, {}, workdir, workdir / f"g{generation}-p{p}.log")
            )

    def _lines(self, word: str) -> list[list[str]]:
        return [
            parts
            for child in self.children
            for parts in map(str.split, child.output().splitlines())
            if parts and parts[0] == word
        ]

    def elected(self) -> dict[str, float]:
        """Election -> wall time of its first win in this generation."""
        first: dict[str, float] = {}
        for _, election, t in self._lines("elected"):
            first[election] = min(first.get(election, float("inf")), float(t))
        return first

    def started(self) -> float | None:
        """Wall time when the first process was up and about to join, or None."""
        times = [float(t) for _, t in self._lines("started")]
        return min(times) if times else None

    def wait_all_elected(self) -> float | None:
        """Wall time when the last election got its first leader, or None on timeout."""
        deadline = time.monotonic() + ELECT_TIMEOUT
        while time.monotonic() < deadline:
            first = self.elected()
            if len(first) == ELECTIONS:
                return max(first.values())
            if not all(c.alive for c in self.children):
                return None
            time.sleep(0.1)
        return None

    def signal(self, sig: int) -> None:
        for child in self.children:
            child.signal(sig, group=False)

    def kill(self) -> None:
        for child in self.children:
            child.kill_group()


@dataclass
class Restart:
    signal: str
    #: Seconds from the signal to every holder until every election has a leader
    #: from the new fleet (None: not within ELECT_TIMEOUT) ...
    elected: float | None
    #: ... and until the first new process was up (Python start-up and imports).
    started: float | None


@dataclass
class LoadResult:
    store: str
    unit: str
    window: float = 0.0
    ops: int = 0  # commands (Redis) or statements (PostgreSQL) in the window
    round_trips: int = 0  # requests clients sent in the window
    cpu: float = 0.0  # server CPU seconds in the window
    restarts: list[Restart] = field(default_factory=list)
    skipped: str | None = None


class _Redis:
    name = "Redis"
    unit = "commands"

    def __init__(self) -> None:
        self.server = RedisServer()
        self.server.start()
        self.url = self.server.url

    def counters(self) -> tuple[int, int, float]:
        """Commands (Redis counts those a Lua script runs too), script calls, CPU seconds."""
        with self.server.client() as client:
            stats = client.info("commandstats")
            cpu = client.info("cpu")
        # Leave out this probe's own INFO calls.
        ops = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
        # Every steady-state request of the Redis backend is one script call.
        scripts = sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_eval"))
        return ops, scripts, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    def close(self) -> None:
        self.server.close()


class _Postgres:
    name = "PostgreSQL"
    unit = "statements"

    def __init__(self) -> None:
        self.server = PostgresServer()
        self.server.start()
        # Every holder keeps a session of its own, holding or queued for the lock;
        # pg_stat_statements counts statements the moment they finish.
        with psycopg.connect(self.server.superuser_url, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET max_connections = {HOLDERS * 2}")
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        self.server.stop()
        self.server.start()
        self._admin_url = self.server.superuser_url.rsplit("/", 1)[0] + f"/{self.server.user}"
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        self.url = self.server.url
        self._postmaster = int((self.server.data_dir / "postmaster.pid").read_text().split()[0])

    def counters(self) -> tuple[int, int, float]:
        """Statements (each one round trip), the same again, CPU seconds."""
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE userid = %s::regrole",
                (self.server.user,),
            ).fetchone()
        assert row is not None
        # pg_stat_statements leaves out statements that fail, and a queued
        # follower's lock wait ends in an error (lock_timeout) once per ttl: the
        # server logs each of those (pg_stat_database would see them only late).
        failed = self.server.log_path.read_text(errors="replace").count("ERROR:")
        statements = int(row[0]) + failed
        return statements, statements, group_cpu_seconds(self._postmaster)

    def close(self) -> None:
        self.server.close()


class _MariaDb:
    name = "MariaDB"
    unit = "statements"

    def __init__(self) -> None:
        self.server = MariaDbServer()
        self.server.start()
        with self.server.root_connection() as conn, conn.cursor() as cur:
            # Every holder keeps a session of its own, holding or queued for the lock.
            cur.execute(f"SET GLOBAL max_connections = {HOLDERS * 2 + 10}")
        self.url = self.server.url
        self._pid = int((self.server.root / "mariadb.pid").read_text())
        self._probes = 0

    def counters(self) -> tuple[int, int, float]:
        """Statements clients sent (each one round trip), the same again, CPU seconds."""
        with self.server.root_connection() as conn, conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
            row = cur.fetchone()
        assert row is not None
        self._probes += 1  # leave out this probe's own statements
        statements = int(row[1]) - self._probes
        return statements, statements, group_cpu_seconds(self._pid)

    def close(self) -> None:
        self.server.close()


class _Etcd:
    name = "etcd (3 members)"
    unit = "requests"

    def __init__(self) -> None:
        self.cluster = EtcdCluster()
        self.cluster.start()
        self.url = self.cluster.url

    def counters(self) -> tuple[int, int, float]:
        """Requests (each one round trip through the gateway), the same again, CPU seconds."""
        metrics = [member.metrics() for member in self.cluster.members]
        requests = int(sum(m.get("grpc_server_started_total", 0.0) for m in metrics))
        cpu = sum(group_cpu_seconds(m.pid) for m in self.cluster.members if m.pid is not None)
        return requests, requests, cpu

    def writes(self) -> int:
        """Raft proposals committed so far: the writes every member puts on disk."""
        return int(
            max(
                m.metrics().get("etcd_server_proposals_committed_total", 0.0)
                for m in self.cluster.members
            )
        )

    def close(self) -> None:
        self.cluster.close()


def measure(
    store: _Redis | _Postgres | _MariaDb | _Etcd,
    window: float,
    quick: bool,
    log: Callable[[str], None],
) -> LoadResult:
    workdir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    fleets = [Fleet(store.url, 0, workdir)]
    if fleets[0].wait_all_elected() is None:
        return LoadResult(store.name, store.unit, skipped="the first fleet never led")
    time.sleep(TTL)  # followers settle into their steady waiting
    writes0 = store.writes() if isinstance(store, _Etcd) else 0
    ops0, trips0, cpu0 = store.counters()
    time.sleep(window)
    ops1, trips1, cpu1 = store.counters()
    writes = ""
    if isinstance(store, _Etcd):
        writes = f", {(store.writes() - writes0) / window:.1f} Raft writes/s"
    log(
        f"  {store.name}: {HOLDERS} holders, {(ops1 - ops0) / window:.0f} {store.unit}/s"
        f"{writes}, server CPU {(cpu1 - cpu0) / window:.1%}"
    )
    result = LoadResult(store.name, store.unit, window, ops1 - ops0, trips1 - trips0, cpu1 - cpu0)
    signals = (signal.SIGKILL,) if quick else (signal.SIGKILL, signal.SIGTERM)
    for generation, sig in enumerate(signals, start=1):
        t0 = time.time()
        fleets[-1].signal(sig)
        fleets.append(Fleet(store.url, generation, workdir))
        done = fleets[-1].wait_all_elected()
        started = fleets[-1].started()
        restart = Restart(
            sig.name,
            None if done is None else done - t0,
            None if started is None else started - t0,
        )
        result.restarts.append(restart)
        log(f"  {store.name}: every election led again {_after(restart)} ({sig.name} to all)")
        fleets[-2].kill()
        time.sleep(TTL)  # the next restart starts from a settled fleet
    for fleet in fleets:
        fleet.kill()
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def _after(restart: Restart) -> str:
    if restart.elected is None:
        return f"not within {ELECT_TIMEOUT:g} s"
    started = "" if restart.started is None else f" (first one up after {restart.started:.2f} s)"
    return f"after {restart.elected:.2f} s{started}"


STORES: dict[str, type[_Redis] | type[_Postgres] | type[_MariaDb] | type[_Etcd]] = {
    "redis": _Redis,
    "postgres": _Postgres,
    "mysql": _MariaDb,
    "etcd": _Etcd,
}


def run(
    quick: bool, log: Callable[[str], None], stores: tuple[str, ...] = tuple(STORES)
) -> list[LoadResult]:
    window = 5.0 if quick else 15.0
    results = []
    for make in (STORES[name] for name in stores):
        try:
            store = make()
        except (AssertionError, RuntimeError, psycopg.Error) as exc:
            reason = str(exc).splitlines()[0][:200]
            results.append(LoadResult(make.name, make.unit, skipped=reason))
            continue
        try:
            results.append(measure(store, window, quick, log))
        finally:
            store.close()
    return results


def per_holder(results: list[LoadResult]) -> str:
    """Round trips per holder per second of each store, in one line."""
    return "; ".join(
        f"{r.store} {r.round_trips / r.window / HOLDERS:.2f}" for r in results if not r.skipped
    )


def table(results: list[LoadResult]) -> str:
    restarts = max((len(r.restarts) for r in results), default=0)
    heads = ["every election led again after SIGKILL of all", "after SIGTERM of all"][:restarts]
    lines = [
        f"| store | {HOLDERS} holders, {ELECTIONS} elections | per holder | server CPU | "
        + " | ".join(heads)
        + " |",
        "|---" * (4 + restarts) + "|",
    ]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.store} | skipped: {r.skipped} |" + " |" * (2 + restarts))
            continue
        rate, trips = r.ops / r.window, r.round_trips / r.window
        load = f"{rate:.0f} {r.unit}/s"
        if r.round_trips != r.ops:
            load += f" ({trips:.0f} script calls/s)"
        cells = [_after(x).removeprefix("after ") for x in r.restarts]
        lines.append(
            f"| {r.store} | {load} | {trips / HOLDERS:.2f} round trips/s "
            f"| {r.cpu / r.window:.1%} of a core | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run this benchmark alone and print its table (``benchmarks/run.py`` runs them all)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 5 s window, SIGKILL only")
    parser.add_argument("stores", nargs="*", metavar="STORE")
    args = parser.parse_args(argv)
    known = list(STORES)
    unknown = [name for name in args.stores if name not in known]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    log = lambda line: print(line, flush=True)  # noqa: E731
    print(table(run(args.quick, log, tuple(args.stores or STORES))))
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["holder"]:
    holder_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
elif __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
