"""What one edit of a store entry costs a replica, in-process, on every store.

For each store a server is started (the test harness's), N entries are put in
it, and a replica's :class:`~celery_leader.schedule.feed.EntryFeed` reads them
once (as at start-up). Then an editor edits one entry, ``--edits`` times, and
after each edit the replica looks once, as it does twice a second. It prints,
per store:

* **first read**: the replica's read of all N entries, in seconds;
* **look after an edit**: the median wall time of the replica's look that sees
  the edit (the version question and the read), in milliseconds;
* **CPU**: the median CPU time of that look in this process (the client side:
  the store's own time is in the wall time only), in milliseconds;
* **entries read**: the entries the store returned to that look (all N when
  the store re-reads everything, the edited one when it reads by change).

    .venv/bin/python -m benchmarks.entry_edit [--n 100000] [--edits 5]
        [--stores redis,postgres,mysql,etcd,file]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery_leader.backends import Edit, StoreFacets, open_store
from celery_leader.schedule.entries import instant_now, new_entry
from celery_leader.schedule.feed import EntryFeed
from celery_leader.settings.config import LeaderConfig
from harness.etcd import EtcdCluster
from harness.servers import MariaDbServer, PostgresServer, RedisServer

STORES = ("redis", "postgres", "mysql", "etcd", "file")
ELECTION = "beat"
#: Edits per call and threads when putting the N entries in (setup, not measured).
BATCH = 1_000
THREADS = 4


@dataclass
class Row:
    store: str
    n: int
    first_read: float
    wall_ms: float
    cpu_ms: float
    read: int


@contextmanager
def server(store: str) -> Iterator[str]:
    """A running, empty store of kind ``store``; yields its URL."""
    if store == "file":
        with tempfile.TemporaryDirectory(prefix="entry-edit-") as directory:
            yield f"file://{directory}"
        return
    kinds: dict[str, Callable[[], Any]] = {
        "redis": RedisServer,
        "postgres": PostgresServer,
        "mysql": MariaDbServer,
        "etcd": lambda: EtcdCluster(size=1),
    }
    with kinds[store]() as running:
        yield running.url


def backend(url: str) -> StoreFacets:
    return open_store(LeaderConfig.from_mapping({"leader_url": url}))


def entry_text(i: int, fields: dict[str, Any]) -> str:
    named = {**fields, "name": f"hourly{i}", "generation": uuid.uuid4().hex}
    return json.dumps(named, sort_keys=True, separators=(",", ":"))


def seed(url: str, n: int) -> dict[str, str]:
    """N hourly entries in the store (as the entries API stores them); name -> JSON."""
    fields = json.loads(
        new_entry(instant_now(), name="hourly0", task="bench.hourly", cron="7 * * * *").to_json()
    )
    texts = {f"hourly{i}": entry_text(i, fields) for i in range(n)}
    names = list(texts)

    def put(first: int) -> None:
        writer = backend(url)
        try:
            edits = [Edit(k, None, texts[k]) for k in names[first : first + BATCH]]
            if not all(writer.entries.edit(ELECTION, edits)):
                raise RuntimeError("an entry existed already in a fresh store")
        finally:
            writer.close()

    # The store's client is imported here, in the main thread: etcd3gw's import
    # (eventlet's) in a pool thread leaves that thread unjoinable.
    backend(url).close()
    # The file store rewrites one file per call: its editors take turns anyway.
    with ThreadPoolExecutor(1 if url.startswith("file:") else THREADS) as pool:
        list(pool.map(put, range(0, n, BATCH)))
    return texts


def counted(reader: StoreFacets) -> list[int]:
    """Count the entries ``reader``'s entry reads return (the list's one item)."""
    count = [0]
    pages_of, since = reader.entries.load_pages, reader.entries.changes_since

    def load_pages(election: str) -> tuple[int, Iterator[dict[str, str]]]:
        version, pages = pages_of(election)

        def counting() -> Iterator[dict[str, str]]:
            for page in pages:
                count[0] += len(page)
                yield page

        return version, counting()

    def entries_changed_since(election: str, version: int) -> Any:
        changed = since(election, version)
        if changed is not None:
            count[0] += len(changed[1])
        return changed

    reader.entries.load_pages = load_pages  # type: ignore[method-assign]
    reader.entries.changes_since = entries_changed_since  # type: ignore[method-assign]
    return count


def look(feed: EntryFeed) -> dict[str, Any]:
    """The replica's look, to the end of a whole read if it starts one (page by page)."""
    entries = feed.current()
    while feed.loading:
        entries = feed.current()
    return entries


def measure(store: str, n: int, edits: int) -> Row:
    with server(store) as url:
        texts = seed(url, n)
        reader, editor = backend(url), backend(url)
        try:
            count = counted(reader)
            feed = EntryFeed(
                reader.entries, ELECTION, logging.getLogger("entry_edit"), interval=0.0
            )
            t0 = time.perf_counter()
            look(feed)
            if len(feed.current()) != n:
                raise RuntimeError("the replica did not read every entry")
            first_read = time.perf_counter() - t0
            probe = f"hourly{n // 2}"
            walls, cpus, reads = [], [], []
            for i in range(edits):
                old = texts[probe]
                texts[probe] = json.dumps({**json.loads(old), "kwargs": {"edit": i}})
                if editor.entries.edit(ELECTION, [Edit(probe, old, texts[probe])]) != [True]:
                    raise RuntimeError(f"the edit of {probe} did not apply")
                count[0] = 0
                t0, c0 = time.perf_counter(), time.process_time()
                seen = look(feed)[probe]
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
                reads.append(count[0])
                if seen.kwargs != {"edit": i}:
                    raise RuntimeError("the replica did not see the edit")
        finally:
            reader.close()
            editor.close()
    return Row(
        store,
        n,
        first_read,
        statistics.median(walls) * 1000,
        statistics.median(cpus) * 1000,
        int(statistics.median(reads)),
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| store | N | first read s | look after an edit ms | CPU ms | entries read |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.store} | {r.n:,} | {r.first_read:.2f} | {r.wall_ms:.1f} | {r.cpu_ms:.1f} "
            f"| {r.read:,} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--edits", type=int, default=5)
    parser.add_argument("--stores", default=",".join(STORES))
    args = parser.parse_args()
    rows = []
    for store in args.stores.split(","):
        t0 = time.monotonic()
        rows.append(measure(store, args.n, args.edits))
        print(f"{store}: done in {time.monotonic() - t0:.0f} s", flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
