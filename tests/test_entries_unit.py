"""Schedule entries kept in the store: the model's checks, edits by compare-and-set,
the leader's incremental feed, the Celery adapter's merge, and the CLI's bad inputs
(one line, exit 2, store unchanged), the last through the real ``celery`` command."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis as redis_lib
from celery import Celery
from celery.schedules import crontab, schedule
from dramatiq.brokers.stub import StubBroker
from redbeat import RedBeatSchedulerEntry

from celery_leader.backends import Edit, EntryStore, RunWrite, open_store
from celery_leader.backends.memory import MemoryEntries
from celery_leader.beat import LeaderScheduler
from celery_leader.celery.entries import entries_of as celery_entries_of
from celery_leader.cli.entries import (
    EntriesApp,
    add_fields,
    redbeat_entries,
    run_command,
)
from celery_leader.dramatiq import LeaderMiddleware
from celery_leader.dramatiq.entries import entries_of as dramatiq_entries_of
from celery_leader.dramatiq.scheduler import DramatiqScheduler
from celery_leader.ledger.records import RunRecord
from celery_leader.schedule import feed as feed_module
from celery_leader.schedule import protocol
from celery_leader.schedule.audit import audit_trail
from celery_leader.schedule.book import EntryBook, EntryConflict, EntryNotFound
from celery_leader.schedule.catalog import EntryCatalog
from celery_leader.schedule.entries import (
    MAX_ENTRY_BYTES,
    Entry,
    EntryError,
    allowed,
    new_entry,
    parse_cron,
)
from celery_leader.schedule.feed import EntryFeed
from celery_leader.schedule.jobs import Outcome
from celery_leader.schedule.run_request import new_request, run_slot, submit
from celery_leader.settings.config import LeaderConfig
from harness.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
CELERY = Path(sys.executable).with_name("celery")
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def memory_entries() -> EntryStore:
    config = LeaderConfig.from_mapping({"leader_url": f"memory://entries-{uuid.uuid4().hex}"})
    return open_store(config).entries


# -- the model ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"every": 0}, "at least 0.001"),
        ({"every": -5}, "at least 0.001"),
        ({"cron": "*/5 * * *"}, "must have 5 fields"),
        ({"cron": "61 * * * *"}, "outside 0-59"),
        ({"cron": "0 0 1 * mon"}, "restricts both"),
        ({"cron": "0 * * * *", "tz": "Mars/Base"}, "unknown time zone"),
        ({"every": 5, "cron": "0 * * * *"}, "exactly one"),
        ({"at": "tomorrow"}, "ISO 8601"),
        ({"every": 5, "args": {"a": 1}}, "args must be a JSON array"),
        ({"every": 5, "options": {"routing": "x"}}, "unknown option"),
        ({"every": 5, "missed_slots": "some"}, "missed_slots must be one of"),
        ({"every": 5, "args": ["x" * MAX_ENTRY_BYTES]}, "more than the limit"),
    ],
)
def test_a_bad_entry_is_one_line_naming_the_problem(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(EntryError, match=message) as caught:
        new_entry(T0, name="e", task="t", **fields)
    assert "\n" not in str(caught.value)


def test_an_entry_round_trips_through_json_and_its_series_is_the_code_entries() -> None:
    entry = new_entry(
        T0,
        name="r",
        task="proj.report",
        cron="30 2 * * *",
        tz="Europe/Paris",
        kwargs={"customer": 42},
        options={"queue": "reports", "priority": 3},
        missed_slots="all",
    )
    assert Entry.from_json(entry.to_json()) == entry
    assert entry.generation and entry.active_since == T0 and entry.version == 1
    # A stored entry over the limit (written by another tool) is refused on reading.
    big = json.dumps({**json.loads(entry.to_json()), "args": ["x" * MAX_ENTRY_BYTES]})
    with pytest.raises(EntryError, match="more than the limit"):
        Entry.from_json(big)
    # 02:30 Paris is 01:30 UTC in winter.
    assert entry.series().next_after(T0) == datetime(2026, 3, 2, 1, 30, tzinfo=timezone.utc)
    every = new_entry(T0, name="e", task="t", every=60)
    assert every.series().next_after(T0 + timedelta(seconds=1)) == T0 + timedelta(minutes=1)


def test_cron_fields_take_ranges_steps_lists_and_names() -> None:
    series = parse_cron("*/15 9-17/4 * jan,JUL mon-fri", timezone.utc)  # type: ignore[arg-type]
    assert series.minutes == [0, 15, 30, 45]
    assert series.hours == [9, 13, 17]
    assert series.months == {1, 7}
    assert series.days_of_week == {1, 2, 3, 4, 5}


def test_an_edit_moves_active_since_only_when_the_schedule_changes_or_it_resumes() -> None:
    entry = new_entry(T0, name="e", task="t", every=10)
    later = T0 + timedelta(hours=1)
    assert entry.edited(later, kwargs={"x": 1}).active_since == T0
    assert entry.edited(later, every=2).active_since == later
    paused = entry.edited(later, enabled=False)
    assert paused.active_since == T0
    resumed_at = later + timedelta(hours=1)
    assert paused.edited(resumed_at, enabled=True).active_since == resumed_at
    assert paused.version == 2 and paused.generation == entry.generation


# -- edits -------------------------------------------------------------------------


def test_the_book_adds_updates_pauses_and_removes_by_compare_and_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = memory_entries()
    book = EntryBook(entries, "beat", code={"tick"})
    # An edit of one entry reads that entry alone: reading every entry made each
    # edit cost the whole schedule (40 s a pause at a million entries on Redis).
    load = entries.load
    monkeypatch.setattr(entries, "load", lambda election: pytest.fail("read every entry"))
    added = book.add(name="r", task="t", every=5)
    with pytest.raises(EntryConflict, match="exists"):
        book.add(name="r", task="t", every=5)
    with pytest.raises(EntryConflict, match="code entry"):
        book.add(name="tick", task="t", every=5)
    replaced = book.add(replace=True, name="r", task="t", every=2)
    assert replaced.generation == added.generation and replaced.version == 2
    with pytest.raises(EntryConflict, match="version 2, not 1"):
        book.update("r", expected_version=1, every=3)
    assert book.update("r", expected_version=2, every=3).every == 3
    assert not book.pause("r").enabled
    assert book.resume("r").enabled
    # A code entry: paused in the store, never removed.
    assert not book.pause("tick").enabled
    with pytest.raises(EntryError, match="code entry"):
        book.remove("tick")
    assert book.resume("tick").enabled
    book.remove("r")
    with pytest.raises(EntryNotFound):
        book.remove("r")
    again = book.add(name="r", task="t", every=5)
    assert again.generation != added.generation, "a re-created name starts fresh"
    monkeypatch.setattr(entries, "load", load)  # listing them all reads them all
    assert [e.name for e in book.list()] == ["r", "tick"]


def test_the_feed_rereads_only_when_the_version_moved_and_then_only_the_edits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = LeaderConfig.from_mapping({"leader_url": f"memory://entries-{uuid.uuid4().hex}"})
    entries = open_store(config).entries  # the feed's; the book edits through its own
    calls = counting_loads(entries)
    feed = EntryFeed(entries, "beat", logging.getLogger("test"), interval=0)
    book = EntryBook(open_store(config).entries, "beat")
    book.add(name="a", task="t", every=5)
    assert set(feed.current()) == {"a"}
    for _ in range(5):
        feed.current()
    assert len(calls) == 1, "no edit, no re-read"
    book.pause("a")
    book.store.edit("beat", [Edit("junk", None, "{not json")])
    current = feed.current()
    assert not current["a"].enabled and "junk" not in current
    assert "skipping stored entry junk" in caplog.text
    book.add(name="b", task="t", every=5)
    book.remove("a")
    assert set(feed.current()) == {"b"}
    assert len(calls) == 1, "edits are read as changes, not by reading every entry"

    # A store that cannot tell what changed: every entry is read again.
    entries.changes_since = lambda election, version: None  # type: ignore[method-assign]
    book.pause("b")
    assert not feed.current()["b"].enabled
    assert len(calls) == 2


def test_the_feed_reads_page_by_page_and_takes_edits_made_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A whole read acts on each page as it comes: a page that repeats an entry (HSCAN
    may) is no change, an entry paused or removed between pages is seen so before the
    last page, and one added meanwhile is there at the end."""
    monkeypatch.setattr(feed_module, "PAGE_SLICE", 0)  # a page per call
    config = LeaderConfig.from_mapping({"leader_url": f"memory://entries-{uuid.uuid4().hex}"})
    entries = open_store(config).entries
    book = EntryBook(open_store(config).entries, "beat")
    for name in ("a", "b", "c", "d"):
        book.add(name=name, task="t", every=5)
    def page(*names: str) -> dict[str, str]:
        """As HSCAN: the entries named, as they are when the page is read."""
        _, texts = entries.load("beat")
        return {name: texts[name] for name in names if name in texts}

    def pages() -> Any:
        yield page("a", "b")
        yield page("b", "c")  # "b" again
        yield page("d")

    version = entries.version
    monkeypatch.setattr(entries, "load_pages", lambda election: (version(election), pages()))
    feed = EntryFeed(entries, "beat", logging.getLogger("test"), interval=0)
    assert feed.current() == {} and feed.loading, "the first page is asked for, not read yet"
    assert set(feed.current()) == {"a", "b"}
    assert feed.take_changes() == {"a", "b"}
    book.pause("a")
    book.remove("c")
    current = feed.current()  # the edits, then the second page
    assert not current["a"].enabled and "c" not in current, "edits read before the last page"
    assert feed.take_changes() == {"a"}, "a repeated page entry is no change"
    book.add(name="e", task="t", every=5)
    while feed.loading:
        feed.current()
    assert set(feed.current()) == {"a", "b", "d", "e"}
    assert feed.take_changes() == {"d", "e"}


def test_a_plan_reads_every_page_of_the_store_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """``leader plan --stored`` reads once, to the last page (a scheduler reads a slice a tick)."""
    monkeypatch.setattr(feed_module, "PAGE_SLICE", 0)
    url = f"memory://entries-{uuid.uuid4().hex}"
    config = LeaderConfig.from_mapping({"leader_url": url})
    book = EntryBook(open_store(config).entries, "beat")
    for i in range(30):
        book.add(name=f"e{i:02}", task="t", every=60)

    def load_pages(self: Any, election: str) -> Any:
        version, texts = self.load(election)
        items = list(texts.items())
        return version, (dict(items[i : i + 7]) for i in range(0, len(items), 7))

    monkeypatch.setattr(MemoryEntries, "load_pages", load_pages)
    catalog = EntryCatalog(config, logging.getLogger("test"), "task")
    jobs = catalog.read_once(lambda: catalog.jobs(catalog.read(), ()))
    assert len(jobs) == 30


def test_the_celery_adapter_merges_store_entries_and_honours_pauses_and_the_allow_list(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feed_module, "POLL_INTERVAL", 0)
    app = Celery("entries_unit", broker="memory://", set_as_current=False)
    app.conf.leader_url = f"memory://entries-{uuid.uuid4().hex}"
    app.conf.leader_entries_allow = ["proj.reports.*"]
    app.conf.beat_schedule = {"tick": {"task": "proj.tick", "schedule": 5.0}}
    scheduler = LeaderScheduler(app=app, lazy=True)
    book = EntryBook(scheduler._protocol.runtime.store.entries, "beat", code={"tick"})
    book.add(name="r1", task="proj.reports.daily", every=2, kwargs={"c": 1})
    book.add(name="x", task="proj.other", every=2)
    book.add(name="p", task="proj.reports.p", every=2, enabled=False)
    names = {j.name: j for j in scheduler.leader_jobs(store_entries=True)}
    assert set(names) == {"tick", "r1"}
    assert "proj.other is outside leader_entries_allow" in caplog.text
    book.pause("tick")
    book.resume("p")
    assert {j.name for j in scheduler.leader_jobs(store_entries=True)} == {"r1", "p"}
    scheduler.close()


def test_a_run_outside_the_grid_has_a_slot_of_its_own() -> None:
    assert run_slot("r", T0) == "r@run:2026-03-01T12:00:00.000+00:00"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"every": "0"}, "above 0"),
        ({"every": "x"}, "a number of seconds"),
        ({"every": "5", "cron": "* * * * *"}, "exactly one"),
        ({"every": "5", "tz": "UTC"}, "--tz goes with --cron"),
        ({"every": "5", "args": "[1,"}, "--args is not JSON"),
        ({"every": "5", "kwargs": "[1]"}, "must be a JSON object"),
    ],
)
def test_add_options_are_checked_before_anything_is_stored(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(EntryError, match=message):
        add_fields("e", "t", **options)  # type: ignore[arg-type]


def test_run_requests_are_held_apart_from_the_entries(caplog: pytest.LogCaptureFixture) -> None:
    config = LeaderConfig.from_mapping({"leader_url": f"memory://entries-{uuid.uuid4().hex}"})
    feed = EntryFeed(open_store(config).entries, "beat", logging.getLogger("test"), interval=0)
    book = EntryBook(open_store(config).entries, "beat")
    book.add(name="a", task="t", every=5)
    before = feed.current()
    request = new_request("a", "k", "me", None, 1.0e9)
    assert submit(book.store, "beat", request) == (request, False)
    assert feed.current() is before, "a request alone leaves the entries as they were"
    assert feed.requests() == {request.store_key: request.dump()}
    assert [e.name for e in book.list()] == ["a"]
    assert submit(book.store, "beat", new_request("a", "k", "you", None, 2.0e9)) == (request, True)
    assert "skipping stored entry" not in caplog.text


# -- the real CLI -----------------------------------------------------------------------


APP = """
from celery import Celery
app = Celery("cli_app", broker="memory://")
app.conf.leader_url = "file://{store}"
app.conf.beat_schedule = {{"tick": {{"task": "cli_app.tick", "schedule": 5.0}}}}

@app.task
def tick():
    pass
"""


@pytest.fixture
def cli(tmp_path: Path) -> Any:
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "cli_app.py").write_text(APP.format(store=store))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CELERY), "-A", "cli_app", "leader", "entries", *args],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run, store


def test_the_cli_refuses_bad_input_with_one_line_and_stores_nothing(cli: Any) -> None:
    run, store = cli
    done = run("add", "ok", "--task", "cli_app.tick", "--every", "5")
    assert done.returncode == 0, done.stderr
    before = sorted((p.name, p.read_text()) for p in store.iterdir() if "entries" in p.name)
    bad = [
        ("add", "b", "--task", "cli_app.tick", "--cron", "*/5 * * *"),
        ("add", "b", "--task", "cli_app.tick", "--cron", "0 * * * *", "--tz", "Mars/Base"),
        ("add", "b", "--task", "cli_app.tick", "--every", "5", "--args", "[1,"),
        ("add", "b", "--task", "cli_app.tick", "--every", "0"),
        ("add", "b", "--task", "cli_app.tick", "--every", "-1"),
        ("add", "b", "--task", "cli_app.tick", "--every", "5", "--args", json.dumps(["x" * 20000])),
        ("add", "b", "--task", "cli_app.nope", "--every", "5", "--strict"),
        ("add", "ok", "--task", "cli_app.tick", "--every", "5"),
        ("add", "tick", "--task", "cli_app.tick", "--every", "5"),
        ("rm", "tick"),
        ("rm", "nothing"),
    ]
    for args in bad:
        done = run(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (args, done.stderr)
    after = sorted((p.name, p.read_text()) for p in store.iterdir() if "entries" in p.name)
    assert after == before, "a refused edit stores nothing"
    done = run("add", "w", "--task", "cli_app.nope", "--every", "5")
    assert done.returncode == 0 and "Warning: this app knows no task" in done.stderr
    listed = json.loads(run("ls", "--json").stdout)
    assert [(r["name"], r["source"]) for r in listed] == [
        ("tick", "code"),
        ("ok", "store"),
        ("w", "store"),
    ]
    exported = run("export").stdout
    assert run("rm", "ok").returncode == 0 and run("rm", "w").returncode == 0
    (store.parent / "e.jsonl").write_text(exported)
    done = run("import", str(store.parent / "e.jsonl"))
    assert done.returncode == 0, done.stderr
    assert [r["name"] for r in json.loads(run("ls", "--json").stdout)] == ["tick", "ok", "w"]


def test_redbeat_entries_are_read_as_json(redis_url: str) -> None:
    app = Celery("redbeat_app", broker=redis_url, set_as_current=False)
    app.conf.redbeat_redis_url = redis_url
    app.conf.timezone = "UTC"
    RedBeatSchedulerEntry(
        "every-7", "proj.seven", schedule(timedelta(seconds=7)), args=[1], app=app
    ).save()
    RedBeatSchedulerEntry(
        "cron-5", "proj.five", crontab(minute="*/5", hour="9-17"), kwargs={"a": 1}, app=app
    ).save()
    found = {e["name"]: e for e in redbeat_entries(redis_url, "redbeat", "UTC")}
    assert found["every-7"] == {
        "name": "every-7",
        "task": "proj.seven",
        "args": [1],
        "kwargs": {},
        "enabled": True,
        "every": 7.0,
    }
    assert found["cron-5"]["cron"] == "*/5 9-17 * * *"
    with redis_lib.Redis.from_url(redis_url) as client:
        assert client.exists("redbeat:every-7")


# -- edit semantics through the Celery adapter ----------------------------------------


class Clock:
    """The wall clock of the slot protocol and of the editors, set by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def test_store_entry_edits_under_missed_slots_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's three edits on store entries, with leader_missed_slots = "all": a
    30 s -> 2 s change sends its first 2 s slot at once, a pause sends nothing from its
    time, a removed and re-created name backfills nothing."""
    clock = Clock(T0)
    monkeypatch.setattr(protocol, "utcnow", clock)
    monkeypatch.setattr(feed_module, "POLL_INTERVAL", 0)
    app = Celery("edits", broker="memory://", set_as_current=False)
    app.conf.leader_url = f"memory://entries-{uuid.uuid4().hex}"
    app.conf.leader_missed_slots = "all"
    app.conf.beat_schedule = {}
    scheduler = LeaderScheduler(app=app, lazy=True)
    sent: list[str] = []

    def send(job: Any, slot: str, due: Any, epoch: int) -> Outcome:
        sent.append(slot)
        return Outcome()

    monkeypatch.setattr(scheduler._protocol.adapter, "send", send)
    scheduler.tick()
    wait_for(scheduler.lease.is_leader, 5, message="never led")
    book = EntryBook(scheduler._protocol.runtime.store.entries, "beat", now=clock)

    def at(seconds: float) -> None:
        clock.now = T0 + timedelta(seconds=seconds)
        scheduler.tick()

    def slots(entry: str) -> list[str]:
        return [s.split("@")[1][17:19] for s in sent if s.startswith(f"{entry}@")]

    book.add(name="iv", task="t", every=30)
    book.add(name="pz", task="t", every=2)
    book.add(name="rc", task="t", every=2)
    for t in range(1, 31):
        at(t)
    assert slots("iv") == ["30"] and len(slots("pz")) == 15
    book.update("iv", every=2)
    at(31)
    at(32)
    assert slots("iv") == ["30", "32"], "the first 2 s slot at once, not after 30 s"
    book.pause("pz")
    book.remove("rc")
    for t in range(33, 48):
        at(t)
    assert not [s for s in slots("pz") if "32" < s < "48"], "nothing while paused"
    assert not [s for s in slots("rc") if "32" < s], "nothing after removal"
    book.resume("pz")
    book.add(name="rc", task="t", every=2)
    at(48)
    at(50)
    assert [s for s in slots("pz") if s > "32"] == ["48", "50"], "nothing from the pause"
    # Re-created at 48: it starts after now, as a new entry does.
    assert [s for s in slots("rc") if s > "32"] == ["50"], "nothing from before it"
    assert len(sent) == len(set(sent))
    scheduler.close()


def test_import_from_redbeat_through_the_cli(cli: Any, redis_url: str) -> None:
    run, store = cli
    app = Celery("redbeat_app", broker=redis_url, set_as_current=False)
    app.conf.redbeat_redis_url = redis_url
    RedBeatSchedulerEntry("every-7", "cli_app.tick", schedule(timedelta(seconds=7)), app=app).save()
    RedBeatSchedulerEntry("hourly", "cli_app.tick", crontab(minute="15"), app=app).save()
    done = run("import", "--from-redbeat", redis_url, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "2 entries would be imported" in done.stdout
    assert not [p for p in store.iterdir() if p.name.endswith(".entries")], "dry run: nothing"
    done = run("import", "--from-redbeat", redis_url)
    assert done.returncode == 0, done.stderr
    listed = {r["name"]: r for r in json.loads(run("ls", "--json").stdout)}
    assert listed["every-7"]["schedule"] == "every 7s"
    assert listed["hourly"]["schedule"] == 'cron "15 * * * *" UTC'
    assert listed["hourly"]["next_due"].endswith(":15:00+00:00")
    again = run("import", "--from-redbeat", redis_url)
    assert again.returncode == 2 and "exist already" in again.stderr


def test_run_with_no_leader_is_queued_in_the_store_and_kept_out_of_the_entries(cli: Any) -> None:
    run, store = cli
    done = run("run", "tick", "--wait", "0.3", "--key", "deploy-42", "--why", "a test")
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "queued as request deploy-42" in done.stdout and "never run late" in done.stdout
    shown = json.loads(run("run", "tick", "--wait", "0", "--key", "deploy-42", "--json").stdout)
    assert (shown["state"], shown["repeated"], shown["slot"]) == ("queued", True, None)
    assert shown["expires_at"] is not None
    listed = json.loads(run("ls", "--json").stdout)
    assert [r["name"] for r in listed] == ["tick"], "a request is no entry"
    assert run("export").stdout == ""
    nothing = run("run", "nothing", "--wait", "0")
    assert nothing.returncode == 2 and "no entry nothing" in nothing.stderr
    config = LeaderConfig.from_mapping({"leader_url": f"file://{store}"})
    opened = open_store(config)
    try:
        trail = audit_trail(opened.journal, "beat", 10)
    finally:
        opened.close()
    assert [(r.action, r.entry, r.why, r.details["key"]) for _, r in trail] == [
        ("run", "tick", "a test", "deploy-42")
    ], "one record: the repeat changed nothing"


def test_a_single_run_at_an_instant_and_the_allow_list_globs(cli: Any) -> None:
    once = new_entry(T0, name="o", task="t", at="2026-03-01T13:00:00Z")
    assert once.series().next_after(T0) == T0 + timedelta(hours=1)
    assert once.series().next_after(T0 + timedelta(hours=1)) is None
    assert allowed("proj.reports.daily", ("proj.reports.*",))
    assert not allowed("proj.other", ("proj.reports.*", "proj.sync"))
    run, _ = cli
    done = run("add", "o", "--task", "cli_app.tick", "--at", "2001-01-01T00:00:00Z")
    assert done.returncode == 2 and "is in the past" in done.stderr
    done = run("add", "o", "--task", "cli_app.tick", "--at", "2099-01-01T00:00:00+02:00")
    assert done.returncode == 0, done.stderr
    shown = json.loads(run("show", "o", "--json").stdout)
    assert shown["next_due"] == "2098-12-31T22:00:00+00:00"


def test_the_python_api_of_both_frameworks(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"memory://entries-{uuid.uuid4().hex}"
    app = Celery("api", broker="memory://", set_as_current=False)
    app.conf.leader_url = url
    app.conf.beat_schedule = {"tick": {"task": "api.tick", "schedule": 5.0}}
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(app, "send_task", lambda task, **kw: sent.append({"task": task, **kw}))
    with celery_entries_of(app) as entries:
        entry = entries.add("r", "api.report", every=60, kwargs={"c": 1})
        assert entries.update("r", expected_version=entry.version, every=30).every == 30
        with pytest.raises(EntryConflict):
            entries.update("r", expected_version=entry.version, every=10)
        # Run now asks the leader; with none, the request waits for one and
        # nothing is sent from this process.
        result = entries.run_now("r", wait=0, why="a test")
        assert (result.state, result.slot, sent) == ("queued", None, [])
        again = entries.run_now("r", key=result.request.key, wait=0)
        assert again.repeated and again.request.requested_at == result.request.requested_at
        entries.pause("tick")
        assert [e.name for e in entries.list()] == ["r", "tick"], "requests are no entries"
        assert entries.get("r") is not None
        entries.remove("r")
        assert entries.get("r") is None

    broker = StubBroker()
    broker.add_middleware(LeaderMiddleware(url=url))

    @dramatiq.actor(broker=broker, queue_name="q")
    def work() -> None:
        pass

    with dramatiq_entries_of(broker) as entries:
        entries.add("w", "work", cron="*/5 * * * *")
        assert entries.run_now("w", wait=0).state == "queued"
        assert broker.queues["q"].qsize() == 0, "the leader sends it, not this process"
        assert [e.name for e in entries.list()] == ["tick", "w"], "one store, two frameworks"


def test_dramatiq_honours_queue_and_expires_and_refuses_priority_and_headers(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(feed_module, "POLL_INTERVAL", 0)
    url = f"memory://entries-{uuid.uuid4().hex}"
    broker = StubBroker()  # its default middleware has AgeLimit, which reads max_age
    broker.add_middleware(LeaderMiddleware(url=url))
    broker.declare_queue("urgent")

    @dramatiq.actor(broker=broker, queue_name="q")
    def job() -> None:
        pass

    with dramatiq_entries_of(broker) as entries:
        for option in ({"priority": 5}, {"headers": {"h": 1}}):
            with pytest.raises(EntryError, match=f"option {next(iter(option))} refused"):
                entries.add("bad", "job", every=60, options=option)
        assert entries.get("bad") is None, "nothing stored"
        entries.add("w", "job", every=60, options={"queue": "urgent", "expires": 2.5})
        with pytest.raises(EntryError, match="option priority refused"):
            entries.update("w", options={"priority": 1})

    # An entry another tool (a Celery app on the same store) wrote with a priority:
    # the Dramatiq leader skips it, logs once, and sends the others.
    config = LeaderConfig.from_mapping({"leader_url": url})
    book = EntryBook(open_store(config).entries, "beat")
    book.add(name="celery-made", task="job", every=60, options={"priority": 3})
    scheduler = DramatiqScheduler(broker, config)
    adapter = scheduler.adapter
    adapter.catalog.open(scheduler.protocol.runtime.store.entries, "beat")
    for _ in range(2):
        jobs = {j.name: j for j in adapter.jobs()}
    assert set(jobs) == {"w"}
    refusals = [r for r in caplog.records if "not sending stored entry celery-made" in r.message]
    assert len(refusals) == 1 and "option priority" in refusals[0].message
    assert adapter.send(jobs["w"], "w@slot", T0, 7).error is None
    sent = json.loads(broker.queues["urgent"].get_nowait())
    assert sent["options"]["max_age"] == 2500 and sent["options"]["leader_slot"] == "w@slot"
    scheduler.protocol.close()

    # The CLI refuses the same in one line with exit 2, storing nothing.
    (tmp_path / "dq_app.py").write_text(
        "import dramatiq\n"
        "from dramatiq.brokers.stub import StubBroker\n"
        "from celery_leader.dramatiq import LeaderMiddleware\n"
        "broker = StubBroker()\n"
        f"broker.add_middleware(LeaderMiddleware(url={url!r}))\n"
        "dramatiq.set_broker(broker)\n"
        "@dramatiq.actor(broker=broker)\n"
        "def job():\n"
        "    pass\n"
    )
    lines = tmp_path / "in.jsonl"
    lines.write_text(
        json.dumps({"name": "h", "task": "job", "every": 5, "options": {"headers": {}}})
    )
    command = ["-m", "celery_leader", "entries", "--app", "dq_app", "-P", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, *command, "import", str(lines)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "option headers refused" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_dramatiq_plan_lists_store_entries_with_stored(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "dq_plan.py").write_text(
        "import dramatiq\n"
        "from dramatiq.brokers.stub import StubBroker\n"
        "from celery_leader.dramatiq import LeaderMiddleware, every\n"
        "broker = StubBroker()\n"
        f"broker.add_middleware(LeaderMiddleware(url='file://{store}'))\n"
        "dramatiq.set_broker(broker)\n"
        "@dramatiq.actor(broker=broker, leader_schedule=every(seconds=30))\n"
        "def tick():\n"
        "    pass\n"
    )
    book = EntryBook(
        open_store(LeaderConfig.from_mapping({"leader_url": f"file://{store}"})).entries, "beat"
    )
    book.add(name="w", task="tick", every=20)
    book.add(name="refused", task="tick", every=20, options={"headers": {"h": 1}})

    window = ["--from", "2030-03-01T12:00:00Z", "--to", "2030-03-01T12:01:00Z", "--json"]

    def plan(*extra: str) -> set[str]:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "celery_leader",
                "plan",
                "dq_plan",
                "-P",
                str(tmp_path),
                *window,
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return {s["slot"] for s in json.loads(done.stdout)["slots"]}

    code_only = plan()
    assert {s.partition("@")[0] for s in code_only} == {"tick"}
    stored = plan("--stored")
    assert stored - code_only == {
        "w@2030-03-01T12:00:20.000+00:00",
        "w@2030-03-01T12:00:40.000+00:00",
        "w@2030-03-01T12:01:00.000+00:00",
    }, "the entry the leader honours, not the refused one"


RB_APP = """
from celery import Celery
app = Celery("rb_app", broker="{url}")
app.conf.timezone = "UTC"
app.conf.leader_url = "{url}"
app.conf.redbeat_redis_url = "{url}"
"""


def test_imported_redbeat_entries_plan_the_slots_redbeat_would_send(
    redis_url: str, tmp_path: Path
) -> None:
    """The done-when of the redbeat import: after ``import --from-redbeat``, ``leader
    plan --stored`` lists the slots redbeat's own schedule objects give for the same
    window. Compared as plans, not by running redbeat: redbeat sends an interval
    from the moment it last ran, so its entry's last run is put on the grid that
    celery-leader counts from the epoch (``docs/entries.md``)."""
    (tmp_path / "rb_app.py").write_text(RB_APP.format(url=redis_url))
    app = Celery("rb_app", broker=redis_url, set_as_current=False)
    app.conf.timezone = "UTC"
    app.conf.redbeat_redis_url = redis_url
    start = datetime(2030, 1, 1, 16, 30, 3, tzinfo=timezone.utc)
    end = start + timedelta(hours=2)
    on_grid = datetime.fromtimestamp(int(start.timestamp()) // 7 * 7, timezone.utc)
    saved = {
        "every-7": (schedule(timedelta(seconds=7), app=app), on_grid),
        "office-5": (crontab(minute="*/5", hour="9-17", app=app), start),
    }
    for name, (every, _) in saved.items():
        RedBeatSchedulerEntry(name, "rb_app.tick", every, app=app).save()

    def redbeat_dues(name: str, last: datetime) -> set[datetime]:
        """redbeat's next due times after ``last``, from its own entry and schedule."""
        entry = RedBeatSchedulerEntry.from_key(f"redbeat:{name}", app=app)
        dues = set()
        while True:
            entry.schedule.nowfun = lambda last=last: last  # as redbeat sees it right at a run
            entry.last_run_at = last
            last = entry.due_at
            if last > end:
                return dues
            if last > start:
                dues.add(last)

    expected = {name: redbeat_dues(name, last) for name, (_, last) in saved.items()}
    assert len(expected["every-7"]) >= 7200 // 7
    assert len(expected["office-5"]) == 17, "16:35 ... 17:55, none after 17:59"

    def celery(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CELERY), "-A", "rb_app", "leader", *args],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = celery("entries", "import", "--from-redbeat", redis_url)
    assert done.returncode == 0 and "2 entries imported" in done.stdout, done.stderr
    done = celery(
        "plan", "--stored", "--json", "--from", start.isoformat(), "--to", end.isoformat()
    )
    assert done.returncode == 0, done.stderr
    planned: dict[str, set[datetime]] = {name: set() for name in saved}
    for slot in json.loads(done.stdout)["slots"]:
        due = datetime.fromisoformat(slot["due"])
        if start < due <= end:
            planned[slot["entry"]].add(due)
    assert planned == expected


def test_show_has_the_run_ledgers_summary_of_the_entry_when_the_ledger_is_on() -> None:
    url = f"memory://entries-{uuid.uuid4().hex}"
    shown: dict[str, Any] = {}
    for ledger in (False, True):
        config = LeaderConfig.from_mapping({"leader_url": url, "leader_ledger": ledger})
        app = EntriesApp(config, {}, {"t"})
        if not ledger:
            run_command(
                app, lambda line: None, "add", fields={"name": "r", "task": "t", "every": 5}
            )
        lines: list[str] = []
        run_command(app, lines.append, "show", name="r", as_json=True)
        shown[str(ledger)] = json.loads(lines[0])
        if not ledger:
            opened = open_store(config)
            done = RunRecord.sent_by("r@2026-03-01T12:00:05+00:00", "beat-1", 1, 100.0)
            ran = replace(done, status="started", attempt=1).ended(102.5, "success")
            opened.runs.put("beat", RunWrite(done.slot, None, ran.dump(), 60, tally=ran.tally))
            opened.close()
    assert "runs" not in shown["False"], "no ledger: nothing of it shown"
    runs = shown["True"]["runs"]
    assert runs["last_slot"] == "r@2026-03-01T12:00:05+00:00"
    assert (runs["state"], runs["outcome"], runs["duration"], runs["runs"]) == (
        "finished",
        "success",
        2.5,
        1,
    )


def counting_loads(entries: Any) -> list[str]:
    """The elections whose entries ``entries`` reads from now on (one item a read)."""
    calls: list[str] = []
    load = entries.load

    def counting(election: str) -> Any:
        calls.append(election)
        return load(election)

    entries.load = counting
    return calls


def counting_listings(catalog: EntryCatalog) -> list[int]:
    """The whole listings of ``catalog``'s jobs from now on (the size of each)."""
    calls: list[int] = []
    jobs = catalog.jobs

    def counting(records: Any, *args: Any) -> Any:
        calls.append(len(records))
        return jobs(records, *args)

    catalog.jobs = counting  # type: ignore[method-assign]
    return calls


def test_a_celery_follower_keeps_store_entry_jobs_made_and_its_promotion_reuses_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(feed_module, "POLL_INTERVAL", 0)
    url = f"memory://entries-{uuid.uuid4().hex}"

    def replica(instance: str) -> LeaderScheduler:
        app = Celery("warm", broker="memory://", set_as_current=False)
        app.conf.leader_url = url
        app.conf.leader_instance_id = instance
        app.conf.beat_schedule = {}
        return LeaderScheduler(app=app)  # set up at start-up, as beat builds it

    leader = replica("one")
    leader.tick()
    wait_for(leader.lease.is_leader, 5, message="never led")
    follower = replica("two")
    book = EntryBook(follower._protocol.runtime.store.entries, "beat")
    book.add(name="a", task="t", every=60)
    follower.tick()
    assert not follower.lease.is_leader()
    adapter = follower._protocol.adapter
    made = {j.name: j for j in adapter.catalog.stored_jobs()}
    assert set(made) == {"a"}, "a follower made the store entry's job"
    book.add(name="b", task="t", every=60)
    follower.tick()
    assert {j.name for j in adapter.catalog.stored_jobs()} == {"a", "b"}, "an edit is seen"
    assert not follower._protocol.held.states, "a follower holds no run state"
    loads = counting_loads(follower._protocol.runtime.store.entries)
    leader.close()
    wait_for(follower.lease.is_leader, 5, message="the follower never took over")
    book.add(name="c", task="t", every=60)  # not yet seen when the new term lists its jobs
    listings = counting_listings(adapter.catalog)
    follower.tick()
    assert follower._protocol.loaded()
    assert loads == [], "the promotion read no entries: it read the edit as a change"
    assert listings == [], "the promotion took the edit, and made no other entry's job again"
    assert follower._protocol.held.jobs["a"] is made["a"], "the job made while following"
    assert "c" in follower._protocol.held.jobs
    follower.close()


def test_a_dramatiq_follower_keeps_store_entry_jobs_made_and_its_promotion_reuses_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(feed_module, "POLL_INTERVAL", 0)
    url = f"memory://entries-{uuid.uuid4().hex}"
    broker = StubBroker()
    broker.add_middleware(LeaderMiddleware(url=url))

    @dramatiq.actor(broker=broker)
    def job() -> None:
        pass

    def replica(instance: str) -> DramatiqScheduler:
        config = LeaderConfig.from_mapping({"leader_url": url, "leader_instance_id": instance})
        scheduler = DramatiqScheduler(broker, config)
        lease = scheduler.protocol.lease
        scheduler.adapter.catalog.open(scheduler.protocol.runtime.store.entries, lease.election)
        lease.start()
        return scheduler

    leader = replica("one")
    wait_for(leader.protocol.lease.is_leader, 5, message="never led")
    leader.tick()
    follower = replica("two")
    book = EntryBook(follower.protocol.runtime.store.entries, "beat")
    book.add(name="a", task="job", every=60)
    follower.tick()
    assert not follower.protocol.lease.is_leader()
    made = {j.name: j for j in follower.adapter.catalog.stored_jobs()}
    assert set(made) == {"a"} and not follower.protocol.held.states
    loads = counting_loads(follower.protocol.runtime.store.entries)
    leader.protocol.close()
    wait_for(follower.protocol.lease.is_leader, 5, message="the follower never took over")
    book.add(name="c", task="job", every=60)  # not yet seen when the new term lists its jobs
    listings = counting_listings(follower.adapter.catalog)
    follower.tick()
    assert follower.protocol.loaded()
    assert loads == [], "the promotion read no entries: it read the edit as a change"
    assert listings == [], "the promotion took the edit, and made no other entry's job again"
    assert follower.protocol.held.jobs["a"] is made["a"]
    assert "c" in follower.protocol.held.jobs
    follower.protocol.close()
