"""The run ledger at volume: ``leader status`` over a million run records.

Run:  python benchmarks/ledger_volume.py [--records 1000000] [--sql-records N]
      [--etcd-records N] [--stores redis,postgres,mariadb,etcd]

Starts its own servers on loopback (redis-server, PostgreSQL, MariaDB, one etcd
member). On each it seeds N run records across 50 entries, as a deployment
keeps them over the default two-day retention: finished runs, one in fifty a
failure, written in the store's own per-entry format with pipelined raw writes
(Redis ``HSET``/``ZADD`` of a thousand fields a command, PostgreSQL ``COPY``,
MariaDB multi-row ``INSERT``, etcd transactions of 64 puts), because writing a
million records through the workers' one-round-trip calls takes hours. Then
it measures, in this order:

* ``leader status``: its wall time through the same call the CLI makes
  (``ops.status``) and through the CLI itself (``python -m celery_leader
  status``, which adds an interpreter's start);
* on Redis, the longest ``PING`` another client waits meanwhile (a thread
  pinging in a loop from before the status read until after it);
* on Redis, memory per record: ``INFO memory`` ``used_memory`` before and after
  the seed, over N;
* one write through the store's own ``runs.put`` (beat's ``sent`` mark of a new
  slot of an entry that holds its N/50 records): p50 and p99 over a hundred
  writes per entry with no cap, then a hundred more with ``leader_ledger_keep``
  at its default (10,000), under what the entries hold: each of those writes
  also drops 100 records over the cap (the most a write drops).

Prints one table. Targets: status within 2 s, no PING over 100 ms, under 300 B
of Redis memory per record.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
import pymysql
import redis
import requests

from celery_leader.backends import RunWrite, StoreFacets, open_store
from celery_leader.backends.etcd.records import RunKeys
from celery_leader.backends.mysql.params import connection_params
from celery_leader.cli import commands as ops
from celery_leader.ledger.records import FAILURE, STARTED, SUCCESS, RunRecord
from celery_leader.settings.config import DEFAULT_LEDGER_RETENTION, LeaderConfig
from harness.etcd import EtcdCluster
from harness.servers import MariaDbServer, PostgresServer, RedisServer

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "bench"
ELECTION = "beat"
ENTRIES = 50
RETENTION = DEFAULT_LEDGER_RETENTION
#: Real writes per entry after the seed (timed).
WRITES = 100
#: The workers named in the records: a Kubernetes pod's hostname, as long as
#: most (a record's size, and so its memory, grows with its worker's name).
WORKER = "celery@reports-worker-7d9f8b6c4-x2kq{}"
#: Records per seeding command or transaction.
BATCH = 1000


@dataclass
class Row:
    store: str
    records: int
    seed_s: float
    memory: int | None = None  # bytes the seed added (Redis)
    status_s: float = 0.0
    cli_s: float = 0.0
    ping_max_ms: float | None = None
    put_p50_ms: float = 0.0
    put_p99_ms: float = 0.0
    trim_p50_ms: float = 0.0
    trim_p99_ms: float = 0.0


def entry_name(i: int) -> str:
    return f"report-{i:02d}"


def slots(entry: int, count: int, now: float) -> Iterator[tuple[str, str, str, float]]:
    """The ``count`` newest slots of an entry as a two-day ledger holds them:
    (key, tally, record, when its record expires), oldest first."""
    period = RETENTION / count
    name = entry_name(entry)
    for i in range(count):
        written = now - (count - i) * period
        due = datetime.fromtimestamp(written - 1.0, timezone.utc)
        key = f"{name}@{due.isoformat(timespec='milliseconds')}"
        outcome = FAILURE if i % 50 == 49 else SUCCESS
        started = written - 0.8
        record = RunRecord(key, STARTED, WORKER.format(entry % 7), 4000 + entry, started,
                           started + 15.0, 1).ended(written, outcome)  # fmt: skip
        yield key, record.tally, record.dump(), written + RETENTION


def split(n: int) -> list[int]:
    """``n`` records over the entries, as evenly as they go."""
    return [n // ENTRIES + (1 if i < n % ENTRIES else 0) for i in range(ENTRIES)]


def config_of(url: str) -> LeaderConfig:
    return LeaderConfig.from_mapping({"leader_url": url, "leader_key_prefix": PREFIX})


# -- seeding, one store at a time ----------------------------------------------


def seed_redis(server: RedisServer, backend: StoreFacets, n: int) -> None:
    client = server.client()
    now = time.time()
    index = f"{{{PREFIX}:{ELECTION}}}:run-entries"
    for e, count in enumerate(split(n)):
        name = entry_name(e)
        records, order, summary = backend.runs._entry_keys(ELECTION, name)  # type: ignore[attr-defined]
        counts: dict[str, int] = {}
        batch: list[tuple[str, str, str, float]] = []
        last = ""
        for slot in slots(e, count, now):
            batch.append(slot)
            counts[slot[1]] = counts.get(slot[1], 0) + 1
            last = slot[0]
            if len(batch) == BATCH:
                _redis_batch(client, name, records, order, batch)
                batch = []
        if batch:
            _redis_batch(client, name, records, order, batch)
        pipe = client.pipeline(transaction=False)
        fields = {"last": last[len(name) + 1 :], **{f"n:{t}": c for t, c in counts.items()}}
        pipe.hset(summary, mapping=fields)
        for key in (records, order, summary):
            pipe.pexpire(key, int(RETENTION * 1000))
        pipe.zadd(index, {name: (now + RETENTION) * 1000})
        pipe.execute()
    client.close()


def _redis_batch(client: Any, name: str, records: str, order: str, batch: list[Any]) -> None:
    cut = len(name) + 1
    pipe = client.pipeline(transaction=False)
    stored = {key[cut:]: f"{tally}|{_b36(int(at * 1000))}|{text}" for key, tally, text, at in batch}
    pipe.hset(records, mapping=stored)
    pipe.rpush(order, *(key[cut:] for key, _, _, _ in batch))
    pipe.execute()


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, d = divmod(n, 36)
        out = digits[d] + out
        if not n:
            return out


def seed_postgres(url: str, backend: StoreFacets, n: int) -> None:
    # The tables, made on first use.
    backend.runs.put(ELECTION, RunWrite("@ledger-since", None, "{}", 60))
    now = time.time()
    with psycopg.connect(url, autocommit=True) as conn:
        columns = "prefix, election, entry, key, value, tally, expires, created"
        entries = []
        with conn.cursor() as cur:
            with cur.copy(f"COPY celery_leader_run_records ({columns}) FROM STDIN") as copy:
                for e, count in enumerate(split(n)):
                    counts: dict[str, int] = {}
                    for key, tally, text, at in slots(e, count, now):
                        name, created = entry_name(e), at - RETENTION
                        copy.write_row((PREFIX, ELECTION, name, key, text, tally, at, created))
                        counts[tally] = counts.get(tally, 0) + 1
                    entries.append((entry_name(e), count, json.dumps(counts)))
            cur.executemany(
                "INSERT INTO celery_leader_run_entries"
                " (prefix, election, entry, kept, counts, until)"
                " VALUES (%s, %s, %s, %s, %s::jsonb, %s)",
                [(PREFIX, ELECTION, e, k, c, now + RETENTION) for e, k, c in entries],
            )
        conn.execute("ANALYZE celery_leader_run_records")


def seed_mariadb(url: str, backend: StoreFacets, n: int) -> None:
    # The tables, made on first use.
    backend.runs.put(ELECTION, RunWrite("@ledger-since", None, "{}", 60))
    now = time.time()
    conn = pymysql.connect(**connection_params(url)[0], autocommit=True)
    try:
        with conn.cursor() as cur:
            for e, count in enumerate(split(n)):
                counts: dict[str, int] = {}
                rows = []
                for key, tally, text, at in slots(e, count, now):
                    created = at - RETENTION
                    rows.append((PREFIX, ELECTION, entry_name(e), key, text, tally, at, created))
                    counts[tally] = counts.get(tally, 0) + 1
                    if len(rows) == BATCH:
                        _mariadb_rows(cur, rows)
                        rows = []
                if rows:
                    _mariadb_rows(cur, rows)
                cur.execute(
                    "INSERT INTO celery_leader_run_entries (prefix, election, entry, kept, until)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    (PREFIX, ELECTION, entry_name(e), count, now + RETENTION),
                )
                cur.executemany(
                    "INSERT INTO celery_leader_run_counts (prefix, election, entry, tally, n)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    [(PREFIX, ELECTION, entry_name(e), t, c) for t, c in counts.items()],
                )
    finally:
        conn.close()


def _mariadb_rows(cur: Any, rows: list[Any]) -> None:
    cur.executemany(
        "INSERT INTO celery_leader_run_records"
        " (prefix, election, entry, run_key, value, tally, expires, created)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        rows,
    )


def seed_etcd(cluster: EtcdCluster, backend: StoreFacets, n: int) -> None:
    base = f"http://{cluster.members[0].endpoint}/v3"
    http = requests.Session()
    grant = http.post(f"{base}/lease/grant", json={"TTL": int(2 * RETENTION)}, timeout=10)
    lease = grant.json()["ID"]

    def put(key: bytes, value: bytes) -> dict[str, Any]:
        b64 = base64.b64encode
        body = {"key": b64(key).decode(), "value": b64(value).decode(), "lease": lease}
        return {"request_put": body}

    def send(ops: list[dict[str, Any]]) -> None:
        reply = http.post(f"{base}/kv/txn", json={"success": ops}, timeout=30)
        reply.raise_for_status()

    now = time.time()
    for e, count in enumerate(split(n)):
        names = RunKeys(backend.runs.etcd, ELECTION, entry_name(e))  # type: ignore[attr-defined]
        cut = len(entry_name(e)) + 1
        ops: list[dict[str, Any]] = []
        tallies: set[str] = set()
        last = ""
        for key, tally, text, _ in slots(e, count, now):
            suffix = key[cut:]
            ops += [
                put(names.record(suffix), f"{tally}|{text}".encode()),
                put(names.tally(tally, suffix), b""),
            ]
            tallies.add(tally)
            last = suffix
            if len(ops) >= 64:
                send(ops)
                ops = []
        ops += [put(names.last, last.encode())]
        ops += [put(names.tallies + t.encode(), b"") for t in tallies]
        send(ops)
    http.close()


# -- measuring -------------------------------------------------------------------


@contextmanager
def pinging(url: str) -> Iterator[list[float]]:
    """A client pinging in a loop meanwhile; yields the list of its latencies (s)."""
    client = redis.Redis.from_url(url, socket_timeout=30)
    latencies: list[float] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            client.ping()
            latencies.append(time.perf_counter() - start)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    time.sleep(0.2)
    try:
        yield latencies
    finally:
        time.sleep(0.2)
        stop.set()
        thread.join(35)
        client.close()


def status_seconds(url: str) -> tuple[float, float]:
    """``leader status``: in process (``ops.status``, as the CLI calls it), then the CLI."""
    lines: list[str] = []
    start = time.perf_counter()
    ops.status(config_of(url), lines.append)
    in_process = time.perf_counter() - start
    shown = [line for line in lines if line.startswith("report-")]
    assert len(shown) == ENTRIES, f"status showed {len(shown)} entries, not {ENTRIES}:\n{lines}"
    env = {**os.environ, "CELERY_LEADER_URL": url, "CELERY_LEADER_KEY_PREFIX": PREFIX}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "celery_leader", "status"],
        cwd=ROOT, env=env, check=False, capture_output=True, timeout=120,
    )  # fmt: skip
    return in_process, time.perf_counter() - start


def timed_writes(backend: StoreFacets, keep: int, first: int) -> tuple[float, float]:
    """p50 and p99 (ms) of ``runs.put`` on seeded entries: beat's mark of a new slot."""
    took = []
    now = time.time()
    for i in range(first, first + WRITES):
        for e in range(ENTRIES):
            due = datetime.fromtimestamp(now + i, timezone.utc)
            key = f"{entry_name(e)}@{due.isoformat(timespec='milliseconds')}"
            start = time.perf_counter()
            sent = RunRecord.sent_by(key, "beat-1", 1, now)
            write = RunWrite(key, None, sent.dump(), RETENTION, keep=keep, tally=sent.tally)
            won, _ = backend.runs.put(ELECTION, write)
            took.append(time.perf_counter() - start)
            assert won, key
    took.sort()
    return statistics.median(took) * 1000, took[int(len(took) * 0.99)] * 1000


def measure(name: str, url: str, n: int, seed: Callable[[StoreFacets], None],
            memory: Callable[[], int] | None = None) -> Row:  # fmt: skip
    config = config_of(url)
    backend = open_store(config)
    before = memory() if memory else 0
    start = time.perf_counter()
    seed(backend)
    row = Row(name, n, time.perf_counter() - start)
    if memory:
        row.memory = memory() - before
    if url.startswith("redis"):
        with pinging(url) as pings:
            row.status_s, row.cli_s = status_seconds(url)
        row.ping_max_ms = max(pings) * 1000
    else:
        row.status_s, row.cli_s = status_seconds(url)
    # As a deployment whose entries keep fewer records than the cap, then one
    # whose cap was lowered under what they keep: each write drops 100 more.
    row.put_p50_ms, row.put_p99_ms = timed_writes(backend, 0, 0)
    row.trim_p50_ms, row.trim_p99_ms = timed_writes(backend, config.ledger_keep, WRITES)
    backend.close()
    print(f"  {row}", file=sys.stderr, flush=True)
    return row


def redis_memory(server: RedisServer) -> Callable[[], int]:
    def used() -> int:
        with server.client() as c:
            return int(c.info("memory")["used_memory"])

    return used


def run(stores: list[str], n: int, sql_n: int, etcd_n: int) -> list[Row]:
    rows = []
    if "redis" in stores:
        with RedisServer() as server:
            rows.append(
                measure("Redis", server.url, n, lambda b: seed_redis(server, b, n),
                        redis_memory(server))
            )  # fmt: skip
    if "postgres" in stores:
        with PostgresServer() as pg:
            seed_pg: Callable[[StoreFacets], None] = lambda b: seed_postgres(pg.url, b, sql_n)  # noqa: E731
            rows.append(measure("PostgreSQL", pg.url, sql_n, seed_pg))
    if "mariadb" in stores:
        with MariaDbServer() as db:
            rows.append(measure("MariaDB", db.url, sql_n, lambda b: seed_mariadb(db.url, b, sql_n)))
    if "etcd" in stores:
        with EtcdCluster(size=1) as cluster:
            rows.append(measure("etcd (1 member)", cluster.url, etcd_n,
                                lambda b: seed_etcd(cluster, b, etcd_n)))  # fmt: skip
    return rows


def table(rows: list[Row]) -> str:
    out = [
        "| store | run records | seed s | memory per record | `leader status` (call) "
        "| `leader status` (CLI) | longest PING meanwhile | write p50 / p99 "
        "| write dropping 100 p50 / p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        per = "—" if r.memory is None else f"{r.memory / r.records:.0f} B"
        ping = "—" if r.ping_max_ms is None else f"{r.ping_max_ms:.1f} ms"
        out.append(
            f"| {r.store} | {r.records:,} | {r.seed_s:.0f} | {per} | {r.status_s:.3f} s "
            f"| {r.cli_s:.2f} s | {ping} | {r.put_p50_ms:.2f} / {r.put_p99_ms:.2f} ms "
            f"| {r.trim_p50_ms:.2f} / {r.trim_p99_ms:.2f} ms |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="run records on Redis")
    parser.add_argument("--sql-records", type=int, default=1_000_000,
                        help="run records on PostgreSQL and MariaDB")  # fmt: skip
    parser.add_argument("--etcd-records", type=int, default=200_000, help="run records on etcd")
    parser.add_argument("--stores", default="redis,postgres,mariadb,etcd")
    args = parser.parse_args(argv)
    rows = run(args.stores.split(","), args.records, args.sql_records, args.etcd_records)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
