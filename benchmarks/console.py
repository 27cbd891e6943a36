"""The console at volume: each view's render time, store round trips, and RSS.

Run:  .venv/bin/python -m benchmarks.console [--entries 100000] [--runs 1000000]
      [--requests 20] [--http 5]

Starts its own redis-server on loopback and seeds, fast and in the store's own
formats (as :mod:`benchmarks.scale` and :mod:`benchmarks.ledger_volume` do):

* ``--entries`` store entries ``report-000000``..., hourly at a minute of their
  own, with ``late_after`` and ``max_runtime`` set; one in a hundred paused
  with a reason. Batches of 5,000 adds, one round trip each.
* ``--runs`` run records over ``--runs / leader_ledger_keep`` of those entries
  (each holds the most the ledger keeps of an entry, 10,000 by default), one in
  fifty a failure, written with pipelined raw ``HSET``/``RPUSH``.
* 50 terms in the term history, with a gap of 4 s before each in which the
  entries of one minute fall due; the lease held; and two changes of the first
  entry with runs in the audit trail.

Then, for each view and its JSON twin:

* **in-process**: median and p95 of ``--requests`` requests to the WSGI
  application (``console_app``) in this process, after one warm-up request
  (at least 3, then no more once 30 s are spent);
* **round trips**: the store round trips of one such request, counted by
  wrapping redis-py's ``Redis.execute_command`` and ``Pipeline.execute`` (a
  pipeline is one);
* **HTTP**: median of ``--http`` requests (no more once 30 s are spent) over
  HTTP to a real ``celery leader console`` process, after one warm-up request,
  timed by the client;

and, once every view was asked over HTTP, the console process's RSS. The
entries list keeps the entries it read while the store's entries version
stays; the rows "entries, after an edit" and "plan, after an edit" time the
first request after a pause or resume of another entry, which reads them all
again. The console's first request, a plan, is timed alone: it reads every
entry and lays out the plan's heap of due times. Target: under 300 ms
(p95, in-process) for a page of the entries list and for an entry's history.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis
import requests
from redis.client import Pipeline

from benchmarks.ledger_volume import WORKER, _redis_batch
from celery_leader.backends import Edit, JournalWrite, StoreFacets, open_store
from celery_leader.cli.entries import EntriesApp, ScheduleEntries
from celery_leader.console import Console, console_app
from celery_leader.election.history import TERMS, TERMS_KEPT, TermRecord, term_key
from celery_leader.ledger.records import FAILURE, STARTED, SUCCESS, RunRecord
from celery_leader.schedule.entries import new_entry
from harness.procs import Proc, spawn_python
from harness.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.apps.bench_app"
CELERY_MAIN = "from celery.__main__ import main; main()"
TASK = "bench.noop"
#: Store entries per batch of adds (one round trip each).
BATCH = 5_000
#: One entry in this many is paused.
PAUSED_EVERY = 100
#: Terms in the history, with a gap of a few seconds before each.
TERMS_SEEDED = 50
HOLDER = "beat-{}"
#: The rows whose target is under 300 ms.
TARGET_MS = 300.0
#: Requests per view: at least this many, then no more once this budget is spent (a
#: slow view must not hold the whole run up).
AT_LEAST = 3
BUDGET_S = 30.0
TARGETED = ("entries, page 1", "entries, a later page", "entry with history")


class Counter:
    """Store round trips of this process: redis-py's commands, a pipeline as one."""

    def __init__(self) -> None:
        self.n = 0

    @contextmanager
    def installed(self) -> Iterator[Counter]:
        command: Any = redis.Redis.execute_command
        execute: Any = Pipeline.execute

        def counted_command(client: Any, *args: Any, **options: Any) -> Any:
            self.n += 1
            return command(client, *args, **options)

        def counted_execute(pipe: Any, *args: Any, **options: Any) -> Any:
            self.n += 1
            return execute(pipe, *args, **options)

        setattr(redis.Redis, "execute_command", counted_command)
        setattr(Pipeline, "execute", counted_execute)
        try:
            yield self
        finally:
            setattr(redis.Redis, "execute_command", command)
            setattr(Pipeline, "execute", execute)


@dataclass
class Row:
    view: str
    url: str
    n: int
    median_ms: float
    p95_ms: float
    round_trips: int
    http_ms: float | None = None


def row_of(view: str, url: str, took: list[float], round_trips: int) -> Row:
    return Row(view, url, len(took), statistics.median(took), percentile(took, 0.95), round_trips)


def entry_name(i: int) -> str:
    return f"report-{i:06d}"


def env_of(url: str) -> dict[str, str]:
    """The benchmark app's settings: the store, and its one code entry hourly."""
    return {"BROKER_URL": url, "LEADER_URL": url, "BEAT_EVERY": "3600", "PYTHONPATH": str(ROOT)}


def entries_app_of(url: str) -> EntriesApp:
    os.environ.update(env_of(url))
    from benchmarks.apps.bench_app import app
    from celery_leader.celery.entries import entries_app

    return entries_app(app)


# -- seeding ---------------------------------------------------------------------


def seed_entries(store: StoreFacets, election: str, n: int) -> None:
    """``n`` hourly store entries, as the entries API stores them (one is built and
    checked by it; the others are its JSON with their own name, minute and
    generation)."""
    now = datetime.now(timezone.utc)
    options = {"late_after": 300, "max_runtime": 900}
    active = new_entry(now, name="x", task=TASK, cron="0 * * * *", options=options)
    pause = {"enabled": False, "paused_by": "ops@bench", "paused_why": "vendor outage"}
    paused = new_entry(now, name="x", task=TASK, cron="0 * * * *", options=options, **pause)
    forms = [json.loads(active.to_json()), json.loads(paused.to_json())]

    def stored(i: int) -> str:
        form = forms[i % PAUSED_EVERY == PAUSED_EVERY - 1]
        named = {**form, "name": entry_name(i), "cron": f"{i % 60} * * * *",
                 "generation": uuid.uuid4().hex}  # fmt: skip
        return json.dumps(named, sort_keys=True, separators=(",", ":"))

    for first in range(0, n, BATCH):
        edits = [Edit(entry_name(i), None, stored(i)) for i in range(first, min(n, first + BATCH))]
        if not all(store.entries.edit(election, edits)):
            raise RuntimeError("an entry existed already in a fresh store")


def with_runs(entries: int, runs: int, keep: int) -> list[tuple[str, int]]:
    """The entries that hold the run records and how many each: as few entries as
    hold ``runs`` at ``keep`` each, spread over the list."""
    holders = min(entries, max(1, -(-runs // keep)))
    step = entries // holders
    return [(entry_name(i * step), runs // holders + (i < runs % holders))
            for i in range(holders)]  # fmt: skip


def seed_runs(client: Any, store: StoreFacets, election: str, entries: list[tuple[str, int]],
              retention: float) -> None:  # fmt: skip
    """Each entry's records, hourly slots back from now, finished (one in fifty a
    failure), in the Redis store's per-entry format."""
    now = time.time()
    index = store.runs._conn.keys(election, "run-entries")[0]  # type: ignore[attr-defined]
    for e, (name, count) in enumerate(entries):
        records, order, summary = store.runs._entry_keys(election, name)  # type: ignore[attr-defined]
        counts: dict[str, int] = {}
        batch: list[tuple[str, str, str, float]] = []
        last = ""
        for i in range(count):
            due = now - (count - i) * 3600.0 - 1.0
            when = datetime.fromtimestamp(due, timezone.utc).isoformat(timespec="milliseconds")
            key = f"{name}@{when}"
            started = due + 0.8
            outcome = FAILURE if i % 50 == 49 else SUCCESS
            record = RunRecord(key, STARTED, WORKER.format(e % 7), 4000 + e, started,
                               started + 15.0, 1).ended(started + 12.0, outcome)  # fmt: skip
            batch.append((key, record.tally, record.dump(), now + retention))
            counts[record.tally] = counts.get(record.tally, 0) + 1
            last = key
            if len(batch) == 1000:
                _redis_batch(client, name, records, order, batch)
                batch = []
        if batch:
            _redis_batch(client, name, records, order, batch)
        pipe = client.pipeline(transaction=False)
        fields = {"last": last[len(name) + 1 :], **{f"n:{t}": c for t, c in counts.items()}}
        pipe.hset(summary, mapping=fields)
        for key in (records, order, summary):
            pipe.pexpire(key, int(retention * 1000))
        pipe.zadd(index, {name: (now + retention) * 1000})
        pipe.execute()


def seed_terms(store: StoreFacets, election: str) -> None:
    """``TERMS_SEEDED`` ended terms, each a day and a minute long less a gap of 4 s
    across a minute's start (hourly entries of that minute fall due in it); then
    the lease, held for the run by the next holder."""
    now = time.time()
    writes = []
    for epoch in range(1, TERMS_SEEDED + 1):
        # Each gap is from 2 s before a minute's start to 2 s after it.
        started = (now - (TERMS_SEEDED - epoch + 1) * 86460.0) // 60 * 60 + 2.0
        record = TermRecord(epoch, HOLDER.format(epoch % 3), started, started + 86456.0, "expired")
        writes.append(JournalWrite(TERMS, term_key(epoch), record.dump(), TERMS_KEPT))
    store.journal.write(election, writes)
    store.lock.acquire(election, HOLDER.format(0), 3600.0, TERMS_SEEDED + 1)


# -- measuring -------------------------------------------------------------------


def request(console: Console, url: str) -> bytes:
    path, _, query = url.partition("?")
    environ = {
        "REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query,
        "HTTP_HOST": "127.0.0.1:5555", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "5555",
        "REMOTE_ADDR": "127.0.0.1", "wsgi.url_scheme": "http",
    }  # fmt: skip
    status: list[str] = []
    body = b"".join(console(environ, lambda s, h, *_: status.append(s)))
    if not status[0].startswith("200"):
        raise RuntimeError(f"{url}: {status[0]}: {body[:300]!r}")
    return body


def timed(console: Console, url: str, times: int, counter: Counter) -> tuple[list[float], int]:
    """The times (ms) of up to ``times`` requests after a warm-up (at least
    ``AT_LEAST``, then no more once ``BUDGET_S`` passed), and the round trips of one."""
    request(console, url)
    took: list[float] = []
    before, spent = counter.n, time.perf_counter()
    while len(took) < times and (len(took) < AT_LEAST or time.perf_counter() - spent < BUDGET_S):
        start = time.perf_counter()
        request(console, url)
        took.append((time.perf_counter() - start) * 1000)
    return took, (counter.n - before) // len(took)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def views(args: argparse.Namespace, history: str) -> list[tuple[str, str, str]]:
    """(view, page URL, JSON URL) of each view measured."""
    later = max(1, args.entries // 50 // 2)
    probe = entry_name(args.entries // 2)[:-2]  # ~100 names share it
    return [
        ("cluster", "/", "/api/cluster"),
        ("entries, page 1", "/entries", "/api/entries"),
        ("entries, a later page", f"/entries?page={later}", f"/api/entries?page={later}"),
        ("entries, search", f"/entries?q={probe}", f"/api/entries?q={probe}"),
        ("entries, paused", "/entries?filter=paused", "/api/entries?filter=paused"),
        ("entry with history", f"/entries/{history}", f"/api/entries/{history}"),
        ("timeline", "/timeline", "/api/timeline"),
        ("problems", "/problems", "/api/problems"),
        ("plan", "/plan", "/api/plan"),
    ]


def after_edit(console: Console, app: EntriesApp, url: str, times: int) -> list[float]:
    """The times (ms) of the first request after each of ``times`` pauses or resumes of
    an entry."""
    took = []
    with ScheduleEntries(app) as api:
        for i in range(times):
            if i % 2:
                api.resume(entry_name(1), "bench", who="bench")
            else:
                api.pause(entry_name(1), "bench", who="bench")
            start = time.perf_counter()
            request(console, url)
            took.append((time.perf_counter() - start) * 1000)
    return took


def over_http(base: str, url: str, times: int) -> float:
    with requests.Session() as web:
        web.get(base + url, timeout=120).raise_for_status()
        took: list[float] = []
        spent = time.perf_counter()
        while len(took) < times and (not took or time.perf_counter() - spent < BUDGET_S):
            start = time.perf_counter()
            web.get(base + url, timeout=120).raise_for_status()
            took.append((time.perf_counter() - start) * 1000)
    return statistics.median(took)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def start_console(url: str) -> tuple[Proc, str]:
    proc = spawn_python(CELERY_MAIN, "-A", APP, "leader", "console", "--port", "0",
                        env=env_of(url), cwd=ROOT)  # fmt: skip
    return proc, proc.wait_for_line(r"console at (http://\S+)/", timeout=60)[1]


def run(args: argparse.Namespace, log: Any) -> tuple[list[Row], dict[str, Any]]:
    with RedisServer() as server:
        app = entries_app_of(server.url)
        config = app.config
        election = config.beat_election
        store = open_store(config)
        client = server.client()
        facts: dict[str, Any] = {}
        try:
            start = time.perf_counter()
            seed_entries(store, election, args.entries)
            facts["entries_s"] = time.perf_counter() - start
            holders = with_runs(args.entries, args.runs, config.ledger_keep)
            start = time.perf_counter()
            seed_runs(client, store, election, holders, config.ledger_retention)
            facts["runs_s"] = time.perf_counter() - start
            facts["holders"] = len(holders)
            history = holders[0][0]
            with ScheduleEntries(app) as api:
                api.pause(history, "a bench change", who="bench")
                api.resume(history, "a bench change", who="bench")
            seed_terms(store, election)
            facts["memory_mb"] = client.info("memory")["used_memory"] / 2**20
            log(f"seeded {args.entries:,} entries in {facts['entries_s']:.0f} s, {args.runs:,}"
                f" runs over {len(holders)} entries in {facts['runs_s']:.0f} s")  # fmt: skip

            rows = []
            console = console_app(app)
            counter = Counter()
            try:
                start = time.perf_counter()
                request(console, "/plan")  # lays out the plan's heap of due times
                facts["plan_first_ms"] = (time.perf_counter() - start) * 1000
                with counter.installed():
                    for view, page, twin in views(args, history):
                        for label, url in ((view, page), (f"{view} (JSON)", twin)):
                            took, trips = timed(console, url, args.requests, counter)
                            rows.append(row_of(label, url, took, trips))
                            log(f"  {label}: {rows[-1].median_ms:.1f} ms, {trips} round trips")
                    for view, url in (("entries", "/entries"), ("plan", "/plan")):
                        took = after_edit(console, app, url, max(2, args.requests // 4))
                        rows.append(row_of(f"{view}, after an edit", url, took, -1))
            finally:
                console.close()

            log("over HTTP")
            proc, base = start_console(server.url)
            try:
                for row in rows:
                    if row.round_trips >= 0:
                        row.http_ms = over_http(base, row.url, args.http)
                facts["rss_mb"] = rss_mb(proc.pid)
            finally:
                proc.kill_group()
        finally:
            client.close()
            store.close()
    return rows, facts


def table(rows: list[Row], facts: dict[str, Any], args: argparse.Namespace) -> str:
    out = [
        f"{args.entries:,} store entries, {args.runs:,} run records over "
        f"{facts['holders']} entries; Redis used_memory {facts['memory_mb']:.0f} MB",
        "",
        "| view | URL | requests | in-process median ms | p95 ms | HTTP median ms "
        "| store round trips | under 300 ms |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        http = "—" if r.http_ms is None else f"{r.http_ms:.1f}"
        trips = "—" if r.round_trips < 0 else str(r.round_trips)
        target = ""
        if r.view.removesuffix(" (JSON)") in TARGETED:
            target = "yes" if r.p95_ms < TARGET_MS else "**no**"
        out.append(f"| {r.view} | `{r.url}` | {r.n} | {r.median_ms:.1f} | {r.p95_ms:.1f} | {http} "
                   f"| {trips} | {target} |")  # fmt: skip
    out += [
        "",
        f"the console's first request, a plan: {facts['plan_first_ms']:.0f} ms (it reads every "
        "entry and lays out the plan's heap of due times)",
        f"console process RSS after every view: {facts['rss_mb']:.0f} MB",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000, help="store entries")
    parser.add_argument("--runs", type=int, default=1_000_000, help="run records")
    parser.add_argument("--requests", type=int, default=20, help="in-process requests per view")
    parser.add_argument("--http", type=int, default=5, help="HTTP requests per view")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {line}", file=sys.stderr, flush=True)

    rows, facts = run(args, log)
    print(table(rows, facts, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
