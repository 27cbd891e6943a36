"""What the cluster, entries, entry and problems views show, as JSON-ready data: the page
renders it, its JSON twin is it.

Each function reads the store through one :class:`~.reads.Reads` and returns
plain data: strings, numbers, lists and dicts, times as ISO 8601.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ..backends import HolderInfo, RunSummary
from ..clock import StoreClock
from ..election.history import TermRecord, term_history
from ..ledger.records import RunRecord
from ..ledger.summary import summarize
from ..schedule.audit import audit_trail
from ..schedule.run_request import run_slot_time
from .listing import PAGE, page_of
from .problems import FILTERS, STATES, slot_due, state_of
from .reads import Reads, iso

#: Runs an entry's page lists, unless the request asks for fewer or more.
RUNS = 50
#: The most runs an entry's page reads.
MAX_RUNS = 1000
#: Audit records an entry's page lists.
AUDIT = 20
#: Terms of each election the cluster view reads for its replicas: the replicas
#: that held it in these are the ones the store knows of.
REPLICA_TERMS = 50


# -- cluster --------------------------------------------------------------------------


def cluster(reads: Reads) -> dict[str, Any]:
    """Per election: holder, epoch, since when, ttl left, and the replicas the store
    knows of (from its term history); and this host's clock against the store's."""
    config = reads.config
    lock = reads.store.lock
    holders = lock.holders(None)
    configured = {config.beat_election, config.worker_election}
    if missing := [name for name in configured if name not in holders]:
        holders.update(lock.holders(missing))
    rows = []
    for name in sorted(holders):
        info = holders[name]
        rows.append(
            {
                "election": name,
                "holder": None if info is None else info.instance_id,
                "epoch": None if info is None else info.epoch,
                "since": None if info is None else iso(info.since),
                "ttl_remaining": None if info is None else info.ttl_remaining,
                "deployment": None if info is None else info.deployment,
                "replicas": replicas(
                    term_history(reads.store.journal, name, REPLICA_TERMS), info
                ),
            }
        )
    measured = StoreClock()
    sent = measured.monotonic()
    now = lock.store_time(config.beat_election)
    if now is not None and lock.clock_resolution is not None:
        measured.sample(now, sent, measured.monotonic(), lock.clock_resolution)
    return {
        "store": config.display_url,
        "elections": rows,
        "clock_offset": measured.offset,
        "clock_error": measured.error,
    }


def replicas(terms: list[TermRecord], holder: HolderInfo | None) -> list[dict[str, Any]]:
    """The replicas ``terms`` (newest first) name, and the ``holder``: each with whether
    it leads now, how many terms it held, and its latest (epoch, start, end, how it
    ended); the holder first, then the latest to lead."""
    latest: dict[str, TermRecord] = {}
    held: Counter[str] = Counter()
    for term in terms:
        latest.setdefault(term.holder, term)
        held[term.holder] += 1
    if holder is not None:
        current = latest.get(holder.instance_id)
        if current is None or current.epoch < holder.epoch:
            # Its term's record is not written yet (or the store lost it): the lock's.
            latest[holder.instance_id] = TermRecord(holder.epoch, holder.instance_id, 0.0)
            held[holder.instance_id] += 1
            since = holder.since
        else:
            since = current.started
    leader = None if holder is None else holder.instance_id
    rows: list[dict[str, Any]] = []
    for name, term in latest.items():
        leads = name == leader
        rows.append(
            {
                "instance": name,
                "leads": leads,
                "terms": held[name],
                "last_epoch": term.epoch,
                "last_started": iso(since if leads else term.started),
                "last_ended": None if leads else iso(term.ended),
                "last_how": "leading" if leads else term.how or "unknown",
            }
        )
    rows.sort(key=lambda row: (not row["leads"], -row["last_epoch"]))
    return rows


# -- entries --------------------------------------------------------------------------


def entries(
    reads: Reads, query: str = "", selected: str = "", page: int = 1, per: int = PAGE
) -> dict[str, Any]:
    """A page of the entries whose name or task holds ``query``, of the filter
    ``selected`` (``failing``, ``late``, ``paused``; empty: all)."""
    index = reads.index()
    names = index.search(query)
    if selected == "paused":
        names = index.paused(names)
    elif selected in FILTERS:
        wanted = FILTERS[selected]
        runs = reads.runs()
        chosen = []
        for name in names:
            if name not in runs:
                continue  # no run recorded: never failing, late or missed
            entry = index.get(name)
            if entry is not None and (
                state_of(entry.enabled, entry.series, runs[name], entry.limits, time.time())
                in wanted
            ):
                chosen.append(name)
        names = chosen
    listing = page_of(index, names, page, per)
    return {
        "query": query,
        "filter": selected if selected in FILTERS else "",
        "filters": sorted(FILTERS),
        **listing.to_json(),
    }


# -- one entry ------------------------------------------------------------------------


def entry(
    reads: Reads, name: str, limit: int = RUNS, show_args: bool = False
) -> dict[str, Any] | None:
    """Entry ``name``: its definition (arguments only when asked), its runs from the
    ledger with p50/p95 duration, and its audit trail; ``None`` when there is none."""
    found = reads.index().get(name)
    if found is None:
        return None
    now = datetime.now(timezone.utc)
    shown = found.row(now)
    definition: dict[str, Any] = {}
    if found.stored is not None and found.source == "store":
        # What the row does not show already; the arguments only when asked.
        for key in _DEFINITION:
            value = getattr(found.stored, key)
            if value not in (None, {}, []):
                definition[key] = value.isoformat() if isinstance(value, datetime) else value
    shown["definition"] = definition
    shown["arguments"] = (
        {"args": list(found.args or ()), "kwargs": dict(found.kwargs or {})} if show_args else None
    )
    limit = max(1, min(limit, MAX_RUNS))
    records = reads.store.runs.runs_of(reads.election, name, limit) if reads.config.ledger else []
    runs = [run_row(key, text) for key, text in records]
    durations = sorted(r["duration"] for r in runs if r["duration"] is not None)
    # Its state from its newest record, read above: not every entry's summary.
    newest = [RunSummary(name, *records[0], {})] if records else []
    last = summarize(newest, time.time())
    shown["state"] = state_of(
        found.enabled, found.series, last[0] if last else None, found.limits, time.time()
    )
    shown["runs"] = runs
    shown["p50"] = _quantile(durations, 0.5)
    shown["p95"] = _quantile(durations, 0.95)
    shown["audit"] = [
        {
            "at": iso(record.at),
            "who": record.who,
            "action": record.action,
            "why": record.why,
            "details": record.details,
        }
        for _, record in audit_trail(reads.store.journal, reads.election, AUDIT, entry=name)
    ]
    return shown


#: The fields of a store entry its page lists besides its row's.
_DEFINITION = (
    "options",
    "start_at",
    "end_at",
    "missed_slots",
    "missed_slots_grace",
    "version",
    "generation",
    "active_since",
)


def run_row(key: str, text: str) -> dict[str, Any]:
    """One run record as the entry's history lists it: due (or, for a run now, when it was
    sent for), the leader's epoch it was sent under, lag (started or sent after either),
    started, finished, duration, outcome, worker, attempt."""
    due = slot_due(key)
    run_now = run_slot_time(key)
    record = RunRecord.load(text, key)
    if record is None:
        return {"slot": key, "due": None if due is None else due.isoformat(),
                "run_now": None if run_now is None else run_now.isoformat(), "state": "unknown",
                "epoch": None, "started": None, "finished": None, "duration": None, "lag": None,
                "worker": None, "attempt": None}  # fmt: skip
    finished = record.finished
    since = due or run_now
    return {
        "slot": key,
        "due": None if due is None else due.isoformat(),
        "run_now": None if run_now is None else run_now.isoformat(),
        "state": record.state,
        "epoch": record.epoch,
        "started": iso(record.started),
        "finished": iso(finished),
        "duration": None if finished is None else round(finished - record.started, 3),
        "lag": None if since is None else round(record.started - since.timestamp(), 3),
        "worker": record.worker,
        "attempt": record.attempt,
    }


def _quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``values`` (nearest rank); ``None`` for none."""
    if not values:
        return None
    return values[min(len(values) - 1, max(0, round(q * len(values) + 0.5) - 1))]


# -- problems -------------------------------------------------------------------------


def problems(reads: Reads) -> dict[str, Any]:
    """Each entry's state (see :mod:`.problems`): the count of each, and every entry
    not on time, worst first."""
    index = reads.index()
    runs = reads.runs()
    now = time.time()
    states: dict[str, str] = {}
    known = [n for n in runs if n in index.records or n in index.app.code]
    for name in {*index.paused(index.names), *known}:
        found = index.get(name)
        if found is not None:
            states[name] = state_of(found.enabled, found.series, runs.get(name), found.limits, now)
    counts = Counter(states.values())
    counts["on time"] = len(index.names) - sum(counts[s] for s in STATES if s != "on time")
    rank = {state: i for i, state in enumerate(STATES)}
    rows = [
        {"name": name, "state": state, "last_slot": runs[name].last_slot if name in runs else None}
        for name, state in sorted(states.items(), key=lambda item: (rank[item[1]], item[0]))
        if state != "on time"
    ]
    return {"counts": {state: counts[state] for state in STATES}, "entries": rows}


def metrics(data: Mapping[str, Any]) -> str:
    """The problem states as Prometheus gauges (text exposition format)."""
    lines = [
        "# HELP celery_leader_entries Schedule entries by state (the console's problems).",
        "# TYPE celery_leader_entries gauge",
    ]
    for state, count in data["counts"].items():
        lines.append(f'celery_leader_entries{{state="{state}"}} {count}')
    return "\n".join(lines) + "\n"
