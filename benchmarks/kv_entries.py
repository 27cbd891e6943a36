"""Schedule entries and their state at volume on etcd and the file store.

Run:  python benchmarks/kv_entries.py [--n 100000,1000000] [--stores etcd,file]

For each N: starts one etcd member on loopback (tmpfs), or makes a file store in a
temporary directory, and seeds N schedule entries and N fenced state records (one
per entry) with raw writes (etcd: transactions of 64 puts; file: the files as the
store writes them), because N edits through the store take hours at a million.
Then it measures, through the store's own calls:

* ``first page``: :meth:`load_pages` until its first page is in hand (what a
  replica waits for before it can dispatch);
* ``whole load``: :meth:`load` of every entry;
* ``edit``: one entry edited through :meth:`edit`;
* ``changes_since``: after that edit, from the version read before it (median of
  five edits);
* ``state load``: :meth:`FencedRecords.load` of every record;
* ``state by keys``: :meth:`load_some` of 2,000 keys (a leader's load chunk),
  ``—`` where the store reads only all of them;
* etcd only, ``range min_mod_revision``: one range over the entries' prefix that
  asks for the keys modified since the version (``count_only``): what reading the
  changes by key revisions instead of etcd's history would cost.

Prints one table.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests

from celery_leader.backends import Edit, StoreFacets, open_store
from celery_leader.settings.config import LeaderConfig
from harness.etcd import EtcdCluster

ELECTION = "beat"
PREFIX = "celery_leader"
#: Puts per seeding transaction (etcd's default --max-txn-ops is 128).
BATCH = 64
#: Keys a leader reads state for at a time (``schedule.sync.LOAD_CHUNK``).
CHUNK = 2000


def entry(i: int) -> str:
    """A store entry's text, about the size of one the console writes."""
    return json.dumps(
        {
            "task": "reports.tasks.refresh_dashboard",
            "schedule": {"every": 60 + i % 600},
            "args": [i],
            "kwargs": {"tenant": f"tenant-{i % 997}", "full": False},
            "options": {"queue": "reports", "expires": 50},
            "enabled": True,
        }
    )


def state(i: int) -> str:
    return json.dumps({"last_run_at": "2026-12-05T03:00:00+00:00", "count": i, "epoch": 3})


def name(i: int) -> str:
    return f"entry-{i:07}"


@dataclass
class Row:
    store: str
    n: int
    seed_s: float
    first_page_s: float
    load_s: float
    edit_s: float
    changes_s: float
    state_load_s: float
    by_keys_s: float | None
    mod_range_s: float | None = None


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def open_url(url: str) -> StoreFacets:
    return open_store(LeaderConfig.from_mapping({"leader_url": url, "leader_timeout": 600}))


def seed_etcd(cluster: EtcdCluster, n: int) -> None:
    base = f"http://{cluster.members[0].endpoint}/v3"
    http = requests.Session()

    def put(key: str, value: str) -> dict[str, Any]:
        b64 = base64.b64encode
        return {
            "request_put": {
                "key": b64(key.encode()).decode(),
                "value": b64(value.encode()).decode(),
            }
        }

    def send(ops: list[dict[str, Any]]) -> None:
        http.post(f"{base}/kv/txn", json={"success": ops}, timeout=60).raise_for_status()

    for kind, text in (("entries", entry), ("state", state)):
        ops: list[dict[str, Any]] = []
        for i in range(n):
            ops.append(put(f"{PREFIX}/{ELECTION}/{kind}/{name(i)}", text(i)))
            if len(ops) == BATCH:
                send(ops)
                ops = []
        if ops:
            send(ops)
    send([put(f"{PREFIX}/{ELECTION}/entries-version", "")])
    http.close()


def seed_file(directory: Path, n: int) -> None:
    entries = {name(i): entry(i) for i in range(n)}
    text = json.dumps({"version": 1, "entries": entries})
    (directory / f"{PREFIX}.{ELECTION}.entries").write_text(text)
    # As the store writes its schedule state: a snapshot naming log 1, and log 1 empty.
    lines = "".join(json.dumps([name(i), state(i)]) + "\n" for i in range(n))
    (directory / f"{PREFIX}.{ELECTION}.state").write_text('{"log": 1}\n' + lines)
    (directory / f"{PREFIX}.{ELECTION}.state-log.1").write_text("")


def measure(label: str, url: str, n: int, seed: Callable[[], None], etcd: str | None) -> Row:
    seed_s = timed(seed)
    store = open_url(url)
    try:
        first = time.perf_counter()
        _, pages = store.entries.load_pages(ELECTION)
        next(pages)
        first_page_s = time.perf_counter() - first
        del pages
        load_s = timed(lambda: store.entries.load(ELECTION))
        edits, changes = [], []
        for k in range(5):
            before = store.entries.version(ELECTION)
            key = name(k * 7)
            edits.append(
                timed(lambda: store.entries.edit(ELECTION, [Edit(key, entry(k * 7), entry(k))]))
            )
            found: list[Any] = []
            changes.append(
                timed(lambda: found.append(store.entries.changes_since(ELECTION, before)))
            )
            assert found[0] is not None and key in found[0][1], found
            store.entries.edit(ELECTION, [Edit(key, entry(k), entry(k * 7))])
        state_load_s = timed(lambda: store.records.load(ELECTION))
        keys = [name(i) for i in range(0, n, max(1, n // CHUNK))][:CHUNK]
        some: list[Any] = []
        by_keys_s = timed(lambda: some.append(store.records.load_some(ELECTION, keys)))
        mod_range_s = None
        if etcd is not None:
            mod_range_s = timed(lambda: mod_range(etcd, before))
        return Row(
            label,
            n,
            seed_s,
            first_page_s,
            load_s,
            statistics.median(edits),
            statistics.median(changes),
            state_load_s,
            None if some[0] is None else by_keys_s,
            mod_range_s,
        )
    finally:
        store.close()


def mod_range(endpoint: str, since: int) -> None:
    start = f"{PREFIX}/{ELECTION}/entries/".encode()
    end = start[:-1] + b"0"
    body = {
        "key": base64.b64encode(start).decode(),
        "range_end": base64.b64encode(end).decode(),
        "min_mod_revision": str(since + 1),
        "count_only": True,
    }
    requests.post(f"http://{endpoint}/v3/kv/range", json=body, timeout=600).raise_for_status()


@contextmanager
def file_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kv-entries-") as d:
        yield Path(d)


def run(stores: list[str], sizes: list[int]) -> list[Row]:
    rows = []
    for n in sizes:
        if "etcd" in stores:
            with EtcdCluster(size=1) as cluster:
                endpoint = cluster.members[0].endpoint
                rows.append(measure("etcd (1 member)", cluster.url, n,
                                    lambda c=cluster: seed_etcd(c, n), endpoint))  # fmt: skip
        if "file" in stores:
            with file_dir() as d:
                rows.append(measure("file", f"file://{d}", n, lambda d=d: seed_file(d, n), None))
    return rows


def table(rows: list[Row]) -> str:
    def s(v: float | None) -> str:
        return "—" if v is None else f"{v:.3f} s"

    out = [
        "| store | entries | seed | first page | whole load | edit | changes_since after it "
        "| state load | state by keys (2,000) | range min_mod_revision |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.store} | {r.n:,} | {r.seed_s:.0f} s | {s(r.first_page_s)} | {s(r.load_s)} "
            f"| {s(r.edit_s)} | {s(r.changes_s)} | {s(r.state_load_s)} | {s(r.by_keys_s)} "
            f"| {s(r.mod_range_s)} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", default="100000", help="entries, comma-separated sizes")
    parser.add_argument("--stores", default="etcd,file")
    args = parser.parse_args(argv)
    print(table(run(args.stores.split(","), [int(x) for x in args.n.split(",")])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
