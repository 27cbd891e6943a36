"""Reads of a large schedule on the SQL stores: entries by page and by change, run state.

For each store a server is started (the test harness's), N entries and N
run-state records are put in its tables (in bulk, by SQL: the store's own
edits would take an hour at a million), and a store opened with the default
settings reads them as a replica and a new leader do. It prints, per store
(each a median of ``--repeat`` reads):

* **first page**: from ``load_pages`` to its first page in hand (the version,
  then one page of ``ENTRIES_PAGE`` entries), in seconds;
* **all entries**: every page, in seconds; **slowest page**: the slowest
  page's statement in that read, ms (to set against the statement deadline);
* **after an edit**: ``changes_since`` of the version read, once one entry was
  edited, ms (the edited entry is all it returns);
* **run state**: ``FencedRecords.load`` of all N records, in seconds; **one
  statement**: the same rows in one statement, as the previous release read
  them (by the database's own client), in seconds; **one chunk**: ``load_some``
  of a scheduler's chunk of keys (2,000), ms.

    .venv/bin/python -m benchmarks.sql_entries [--n 1000000] [--repeat 3]
        [--stores postgres,mysql]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pymysql

from celery_leader.backends import Edit, StoreFacets, open_store
from celery_leader.backends.mysql.params import connection_params
from celery_leader.schedule.entries import instant_now, new_entry
from celery_leader.settings.config import LeaderConfig
from harness.servers import MariaDbServer, PostgresServer

STORES = ("postgres", "mysql")
ELECTION = "beat"
PREFIX = LeaderConfig.from_mapping({"leader_url": "redis://"}).key_prefix
#: Rows a seeding statement inserts.
SEED_BATCH = 50_000
#: Keys of one ``load_some``: a chunk of the scheduler's loading.
CHUNK = 2_000


@dataclass
class Row:
    store: str
    n: int
    deadline: float
    first_page: float
    load: float
    slowest_page_ms: float
    since_ms: float
    state: float
    one_statement: float
    chunk_ms: float


@contextmanager
def server(store: str) -> Iterator[str]:
    """A running, empty store of kind ``store``; yields its URL."""
    kinds: dict[str, Callable[[], Any]] = {"postgres": PostgresServer, "mysql": MariaDbServer}
    with kinds[store]() as running:
        yield running.url


def opened(url: str) -> StoreFacets:
    return open_store(LeaderConfig.from_mapping({"leader_url": url}))


def templates() -> tuple[str, str]:
    """An entry's JSON and a run state's, with ``@@`` where the entry's number goes."""
    entry = new_entry(instant_now(), name="hourly0", task="bench.hourly", cron="7 * * * *")
    fields = {**json.loads(entry.to_json()), "name": "hourly@@", "generation": "0" * 32}
    state = {"last_run_at": "2026-12-05T03:07:00+00:00", "count": 12, "slot": "hourly@@"}
    return (
        json.dumps(fields, sort_keys=True, separators=(",", ":")),
        json.dumps(state, sort_keys=True, separators=(",", ":")),
    )


def seed(store: str, url: str, n: int) -> str:
    """Tables made and the version row written by the store (an edit of ``hourly0``,
    whose JSON it returns), then the other entries and N state records in bulk."""
    entry, state = templates()
    first = opened(url)
    try:
        text = entry.replace("@@", "0")
        if first.entries.edit(ELECTION, [Edit("hourly0", None, text)]) != [True]:
            raise RuntimeError("the store was not empty")
    finally:
        first.close()
    if store == "postgres":
        _seed_postgres(url, n, entry, state)
    else:
        _seed_mysql(url, n, entry, state)
    return text


def _seed_postgres(url: str, n: int, entry: str, state: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(0, n, SEED_BATCH):
            hi = min(n, lo + SEED_BATCH) - 1
            params = {"prefix": PREFIX, "election": ELECTION, "lo": max(lo, 1), "hi": hi}
            conn.execute(
                "INSERT INTO celery_leader_entries (prefix, election, name, value)"
                " SELECT %(prefix)s, %(election)s, 'hourly' || i, replace(%(t)s, '@@', i::text)"
                " FROM generate_series(%(lo)s::int, %(hi)s::int) AS i",
                {**params, "t": entry},
            )
            conn.execute(
                "INSERT INTO celery_leader_state (prefix, election, entry, value)"
                " SELECT %(prefix)s, %(election)s, 'hourly' || i, replace(%(t)s, '@@', i::text)"
                " FROM generate_series(%(lo)s::int, %(hi)s::int) AS i",
                {**params, "lo": lo, "t": state},
            )
        conn.execute("VACUUM ANALYZE celery_leader_entries")
        conn.execute("VACUUM ANALYZE celery_leader_state")


def _seed_mysql(url: str, n: int, entry: str, state: str) -> None:
    conn = pymysql.connect(**connection_params(url)[0], autocommit=True)
    try:
        with conn.cursor() as cursor:
            for lo in range(0, n, SEED_BATCH):
                hi = min(n, lo + SEED_BATCH) - 1
                # MariaDB's SEQUENCE engine: seq_<lo>_to_<hi> is a table of those numbers.
                for table, column, start, text in (
                    ("celery_leader_entries", "name", max(lo, 1), entry),
                    ("celery_leader_state", "entry", lo, state),
                ):
                    cursor.execute(
                        f"INSERT INTO {table} (prefix, election, {column}, value)"
                        f" SELECT %s, %s, CONCAT('hourly', seq), REPLACE(%s, '@@', seq)"
                        f" FROM seq_{start}_to_{hi}",
                        (PREFIX, ELECTION, text),
                    )
            cursor.execute("ANALYZE TABLE celery_leader_entries, celery_leader_state")
    finally:
        conn.close()


ALL_STATE = "SELECT entry, value FROM celery_leader_state WHERE prefix = %s AND election = %s"


def one_statement(store: str, url: str) -> float:
    """Seconds to read every state record in one statement (the previous release's read)."""
    t = time.perf_counter()
    if store == "postgres":
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(ALL_STATE, (PREFIX, ELECTION)).fetchall()
    else:
        conn = pymysql.connect(**connection_params(url)[0], autocommit=True)
        try:
            with conn.cursor() as cursor:
                cursor.execute(ALL_STATE, (PREFIX, ELECTION))
                rows = list(cursor.fetchall())
        finally:
            conn.close()
    if not rows:
        raise RuntimeError("no state records")
    return time.perf_counter() - t


def timed_pages(reader: StoreFacets) -> tuple[float, float, float, int]:
    """One ``load_pages`` read: first page s, all s, slowest page s, entries read."""
    t0 = time.perf_counter()
    _, pages = reader.entries.load_pages(ELECTION)
    count, slowest, first = 0, 0.0, 0.0
    while True:
        t = time.perf_counter()
        page = next(pages, None)
        took = time.perf_counter() - t
        if page is None:
            break
        if not first:
            first = time.perf_counter() - t0
        slowest = max(slowest, took)
        count += len(page)
    return first, time.perf_counter() - t0, slowest, count


def measure(store: str, n: int, repeat: int) -> Row:
    with server(store) as url:
        t0 = time.monotonic()
        current = seed(store, url, n)
        print(f"{store}: {n:,} entries and records seeded in {time.monotonic() - t0:.0f} s")
        reader, editor = opened(url), opened(url)
        try:
            reads = [timed_pages(reader) for _ in range(repeat)]
            if any(count != n for *_, count in reads):
                raise RuntimeError("a read did not return every entry")
            sinces = []
            for i in range(repeat):
                version = reader.entries.version(ELECTION)
                edited = json.dumps({**json.loads(current), "kwargs": {"edit": i}})
                if editor.entries.edit(ELECTION, [Edit("hourly0", current, edited)]) != [True]:
                    raise RuntimeError("the edit did not apply")
                t = time.perf_counter()
                changed = reader.entries.changes_since(ELECTION, version)
                sinces.append(time.perf_counter() - t)
                if changed is None or changed[1] != {"hourly0": edited}:
                    raise RuntimeError(f"changes_since did not return the edit: {changed}")
                current = edited
            states, chunks = [], []
            keys = [f"hourly{i}" for i in range(n // 2, n // 2 + CHUNK)]
            for _ in range(repeat):
                t = time.perf_counter()
                if len(reader.records.load(ELECTION)) != n:
                    raise RuntimeError("load did not return every record")
                states.append(time.perf_counter() - t)
                t = time.perf_counter()
                some = reader.records.load_some(ELECTION, keys)
                chunks.append(time.perf_counter() - t)
                if some is None or len(some) != len(keys):
                    raise RuntimeError("load_some did not return the chunk")
            deadline = reader.timeout
            whole = [one_statement(store, url) for _ in range(repeat)]
        finally:
            reader.close()
            editor.close()
    med = statistics.median
    return Row(
        store,
        n,
        deadline,
        med(r[0] for r in reads),
        med(r[1] for r in reads),
        med(r[2] for r in reads) * 1000,
        med(sinces) * 1000,
        med(states),
        med(whole),
        med(chunks) * 1000,
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| store | N | first page s | all entries s | slowest page ms | after an edit ms "
        "| run state s | in one statement s | one chunk ms | store deadline s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.store} | {r.n:,} | {r.first_page:.3f} | {r.load:.2f} | {r.slowest_page_ms:.0f} "
            f"| {r.since_ms:.1f} | {r.state:.2f} | {r.one_statement:.2f} | {r.chunk_ms:.1f} "
            f"| {r.deadline:g} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stores", default=",".join(STORES))
    args = parser.parse_args()
    rows = []
    for store in args.stores.split(","):
        t0 = time.monotonic()
        rows.append(measure(store, args.n, args.repeat))
        print(f"{store}: done in {time.monotonic() - t0:.0f} s", flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
