"""The entries' side of the console's actions: every change in the audit trail (who,
when, what, why), pauses with a reason and an end that run out by themselves, and
the ``late_after`` / ``max_runtime`` options. On the memory and file stores, through
the book, the Python API, both frameworks' schedulers and the real ``celery`` command."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from celery import Celery
from dramatiq.brokers.stub import StubBroker

from celery_leader.backends import Journal, JournalWrite, open_store
from celery_leader.beat import LeaderScheduler
from celery_leader.celery.adapter import BeatAdapter
from celery_leader.celery.entries import entries_app
from celery_leader.celery.entries import entries_of as celery_entries_of
from celery_leader.cli import entries as cli_entries
from celery_leader.cli.entries import EntriesApp, run_command
from celery_leader.console import console_app
from celery_leader.dramatiq import LeaderMiddleware, every
from celery_leader.dramatiq.entries import entries_of as dramatiq_entries_of
from celery_leader.dramatiq.scheduler import DramatiqScheduler
from celery_leader.exceptions import ConfigError, StoreUnavailable
from celery_leader.schedule import catalog as catalog_module
from celery_leader.schedule import feed as feed_module
from celery_leader.schedule import protocol
from celery_leader.schedule.audit import audit_trail
from celery_leader.schedule.book import EntryBook
from celery_leader.schedule.entries import Entry, EntryError, new_entry
from celery_leader.schedule.jobs import Outcome
from celery_leader.settings.config import LeaderConfig
from harness.waiting import wait_for

CELERY = Path(sys.executable).with_name("celery")
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


class Clock:
    """The wall clock of the book, the catalog and the slot protocol, set by the test."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def at(self, seconds: float) -> None:
        self.now = T0 + timedelta(seconds=seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    now = Clock()
    monkeypatch.setattr(protocol, "utcnow", now)
    monkeypatch.setattr(catalog_module, "instant_now", now)
    monkeypatch.setattr(feed_module, "POLL_INTERVAL", 0)
    return now


def memory_config(**settings: Any) -> LeaderConfig:
    return LeaderConfig.from_mapping(
        {"leader_url": f"memory://audit-{uuid.uuid4().hex}", **settings}
    )


def book_of(config: LeaderConfig, now: Clock, **options: Any) -> EntryBook:
    store = open_store(config)
    return EntryBook(
        store.entries, "beat", {"tick"}, now=now, journal=store.journal, actor="ops@h", **options
    )


# -- the trail ----------------------------------------------------------------------------


def test_every_change_is_in_the_trail_with_who_when_what_and_why() -> None:
    now = Clock()
    config = memory_config()
    book = book_of(config, now)
    book.add(name="r", task="t", every=5, kwargs={"secret": "s3"}, why="new report")
    now.at(1)
    book.update("r", every=10, kwargs={"secret": "other"}, who="ann@desk")
    now.at(2)
    book.add(replace=True, name="r", task="t", every=20)
    now.at(3)
    book.pause("r", why="quarter close", until=T0 + timedelta(hours=1))
    now.at(4)
    book.resume("r", why="closed early")
    now.at(5)
    book.pause("tick", "deploy")
    now.at(6)
    book.record("r", "run", "to check", details={"slot": "r@run:x"})
    now.at(7)
    book.remove("r", why="gone")
    now.at(8)
    book.add(name="i", task="t", every=5, imported=True)
    journal = open_store(config).journal
    trail = [record for _, record in audit_trail(journal, "beat", 20, entry="r")]
    assert [(r.action, r.who, r.why) for r in trail] == [
        ("remove", "ops@h", "gone"),
        ("run", "ops@h", "to check"),
        ("resume", "ops@h", "closed early"),
        ("pause", "ops@h", "quarter close"),
        ("update", "ops@h", None),
        ("update", "ann@desk", None),
        ("add", "ops@h", "new report"),
    ]
    assert [r.at for r in trail][-4:] == [T0.timestamp() + n for n in (3, 2, 1, 0)]
    assert trail[-1].details == {"task": "t", "schedule": "every 5s"}
    # Which fields changed, never their values: kwargs may hold secrets.
    assert trail[-2].details == {"fields": ["every", "kwargs"]}
    assert "s3" not in json.dumps([r.details for r in trail])
    assert trail[3].details == {"until": "2026-03-01T13:00:00+00:00"}
    assert trail[1].details == {"slot": "r@run:x"}
    everything = [(r.action, r.entry) for _, r in audit_trail(journal, "beat", 20)]
    assert everything[:3] == [("import", "i"), ("remove", "r"), ("run", "r")]
    assert ("pause", "tick") in everything, "a code entry's pause too"


def test_each_log_keeps_the_newest_leader_audit_keep_records() -> None:
    config = memory_config(leader_audit_keep=3)
    assert config.audit_keep == 3
    with pytest.raises(ConfigError, match="leader_audit_keep"):
        memory_config(leader_audit_keep=0)
    api = celery_entries_of(_celery_app(config.url, leader_audit_keep=3))
    api.add("r", "t", every=5)
    for n in range(4):
        api.pause("r", why=f"p{n}")
    assert [c.why for c in api.changes("r")] == ["p3", "p2", "p1"]
    api.close()


class BrokenJournal(Journal):
    def write(self, election: str, writes: Sequence[JournalWrite]) -> None:
        raise StoreUnavailable("journal down")

    def read(
        self, election: str, log: str, limit: int, before: str | None = None
    ) -> list[tuple[str, str]]:
        return []


def test_a_trail_that_cannot_be_written_leaves_the_change_made_and_says_so_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = open_store(memory_config())
    said: list[str] = []
    book = EntryBook(store.entries, "beat", journal=BrokenJournal(), warn=said.append)
    book.add(name="r", task="t", every=5)
    paused = book.pause("r", why="x")
    assert not paused.enabled and not book.get("r").enabled  # type: ignore[union-attr]
    assert said == [
        "r: add done, but the audit trail did not record it: StoreUnavailable: journal down",
        "r: pause done, but the audit trail did not record it: StoreUnavailable: journal down",
    ]
    # Without a warn of its own (the Python API): a logged warning.
    logged = EntryBook(store.entries, "beat", journal=BrokenJournal())
    logged.resume("r")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert lines == [
        "celery-leader: r: resume done, but the audit trail did not record it: "
        "StoreUnavailable: journal down"
    ]


def test_the_cli_says_in_one_warning_line_that_the_trail_missed_a_change_it_made(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = memory_config()
    opened = open_store(config)
    broken = dataclasses.replace(opened, journal=BrokenJournal(), close=lambda: None)
    monkeypatch.setattr(cli_entries, "open_store", lambda config: broken)
    app = EntriesApp(config, {}, {"t"})
    fields = {"name": "r", "task": "t", "every": 5}
    assert run_command(app, print, "add", fields=fields, why="x") == 0
    assert run_command(app, print, "pause", name="r", why="deploy") == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["r: every 5s -> t (version 1)", "r: paused"]
    assert err.splitlines() == [
        f"Warning: r: {action} done, but the audit trail did not record it: "
        "StoreUnavailable: journal down"
        for action in ("add", "pause")
    ]
    stored = open_store(config).entries.load("beat")[1]["r"]
    assert Entry.from_json(stored).paused_why == "deploy", "the change is made"


# -- pause with a reason and an end ----------------------------------------------------------


def test_a_pause_keeps_who_why_and_until_and_runs_out_by_itself() -> None:
    now = Clock()
    book = book_of(memory_config(), now)
    book.add(name="r", task="t", every=5)
    until = T0 + timedelta(seconds=30)
    with pytest.raises(EntryError, match="is not in the future"):
        book.pause("r", until=T0)
    with pytest.raises(EntryError, match="ISO 8601"):
        book.pause("r", until="next tuesday")
    paused = book.pause("r", "deploy", "2026-03-01T12:00:30Z", who="ann@desk")
    assert (paused.paused_by, paused.paused_why, paused.paused_until) == (
        "ann@desk",
        "deploy",
        until,
    )
    assert paused.paused_at(T0 + timedelta(seconds=29))
    assert not paused.paused_at(until), "runs again at its end"
    assert paused.running_since(until + timedelta(hours=1)) == until, "nothing from the pause"
    # An edit after the end starts from the entry resumed at the end.
    now.at(40)
    edited = book.update("r", kwargs={"x": 1})
    assert edited.enabled and edited.active_since == until and edited.paused_by is None
    # Resumed early: from now, and the pause is gone.
    book.pause("r", "again", until=T0 + timedelta(hours=1))
    now.at(50)
    resumed = book.resume("r")
    assert resumed.active_since == T0 + timedelta(seconds=50)
    assert (resumed.paused_by, resumed.paused_why, resumed.paused_until) == (None, None, None)
    # A code entry keeps its pause the same way.
    code = book.pause("tick", "noisy", until=T0 + timedelta(minutes=2))
    assert code.kind == "code" and code.paused_why == "noisy" and code.paused_by == "ops@h"
    with pytest.raises(EntryError, match="only a paused entry"):
        new_entry(T0, name="e", task="t", every=5, paused_why="x")


def _celery_app(url: str, **conf: Any) -> Celery:
    app = Celery("audit_app", broker="memory://", set_as_current=False)
    app.conf.leader_url = url
    app.conf.beat_schedule = {"tick": {"task": "proj.tick", "schedule": 2.0}}
    for key, value in conf.items():
        app.conf[key] = value
    return app


def test_celery_beat_sends_nothing_while_paused_and_again_from_the_pauses_end(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store entry and a code entry, every 2 s, paused at 5 s until 21 s (and the
    missed-slot policy "all", which would send anything it counted as missed):
    nothing due in the pause is sent, and both send again from 22 s without an edit."""
    app = _celery_app(f"memory://audit-{uuid.uuid4().hex}", leader_missed_slots="all")
    scheduler = LeaderScheduler(app=app, lazy=True)
    sent: list[str] = []

    def send(job: Any, slot: str, due: Any, epoch: int) -> Outcome:
        sent.append(slot)
        return Outcome()

    monkeypatch.setattr(scheduler._protocol.adapter, "send", send)
    scheduler.tick()
    wait_for(scheduler.lease.is_leader, 5, message="never led")
    store = scheduler._protocol.runtime.store
    book = EntryBook(store.entries, "beat", {"tick"}, now=clock, journal=store.journal)
    book.add(name="st", task="t", every=2)

    def seconds_of(entry: str) -> list[int]:
        return [int(s.split("@")[1][17:19]) for s in sent if s.startswith(f"{entry}@")]

    for t in range(1, 6):
        clock.at(t)
        scheduler.tick()
    until = T0 + timedelta(seconds=21)
    book.pause("st", "maintenance", until)
    book.pause("tick", "maintenance", until.isoformat())
    for t in range(6, 21):
        clock.at(t)
        scheduler.tick()
    assert seconds_of("st") == [2, 4] and seconds_of("tick") == [2, 4], sent
    for t in (21, 21.5, 22, 24):
        clock.at(t)
        scheduler.tick()
    assert seconds_of("st") == [2, 4, 22, 24], "nothing from the pause, then its grid"
    assert seconds_of("tick") == [2, 4, 22, 24]
    assert len(sent) == len(set(sent))
    scheduler.close()


def test_the_dramatiq_scheduler_lists_an_entry_again_when_its_pause_runs_out(
    clock: Clock,
) -> None:
    config = memory_config()
    broker = StubBroker()
    broker.add_middleware(LeaderMiddleware(url=config.url))

    @dramatiq.actor(broker=broker, leader_schedule=every(2))
    def tick() -> None:
        pass

    book = book_of(config, clock)
    book.code = frozenset({"tick"})
    book.add(name="st", task="tick", every=2)
    until = T0 + timedelta(seconds=30)
    book.pause("st", "x", until)
    book.pause("tick", "x", until)
    scheduler = DramatiqScheduler(broker, config)
    adapter = scheduler.adapter
    adapter.catalog.open(scheduler.protocol.runtime.store.entries, "beat")
    assert adapter.jobs() == []
    clock.at(29)
    assert not adapter.jobs_changed()
    clock.at(30)
    assert adapter.jobs_changed(), "the pause ran out: listed again, with no edit"
    jobs = {job.name: job for job in adapter.jobs()}
    assert set(jobs) == {"tick", "st"}
    assert jobs["tick"].active_since == until and jobs["st"].active_since == until
    assert not adapter.jobs_changed()
    scheduler.protocol.close()


def test_a_plan_counts_a_pause_with_an_end_as_over_from_its_end() -> None:
    """``leader plan --stored`` lists what the leader will send: an entry paused until
    a time from that time (its ``active_since``), one paused until resumed not at all."""
    app = _celery_app(f"memory://audit-{uuid.uuid4().hex}")
    scheduler = LeaderScheduler(app=app, lazy=True)
    store = scheduler._protocol.runtime.store
    book = EntryBook(store.entries, "beat", {"tick"}, journal=store.journal)
    book.add(name="st", task="t", every=2)
    book.add(name="held", task="t", every=2)
    until = datetime.now(timezone.utc) + timedelta(hours=1)
    book.pause("st", until=until)
    book.pause("tick", until=until)
    book.pause("held")
    jobs = {job.name: job for job in scheduler.leader_jobs(store_entries=True)}
    assert set(jobs) == {"st", "tick"}
    assert jobs["st"].active_since == until and jobs["tick"].active_since == until
    scheduler.close()


# -- late_after and max_runtime ---------------------------------------------------------------


def test_late_after_and_max_runtime_are_checked_kept_and_change_nothing_in_dispatch(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad in ("soon", 0, -1, True):
        with pytest.raises(EntryError, match="option late_after must be seconds above 0") as e:
            new_entry(T0, name="e", task="t", every=5, options={"late_after": bad})
        assert "\n" not in str(e.value)
    limits = {"late_after": 30, "max_runtime": 600.5}
    entry = new_entry(T0, name="e", task="t", every=5, options={"queue": "q", **limits})
    assert entry.options == {"queue": "q", **limits}
    # Celery: code entries' options, read by the console only, never sent.
    url = f"memory://audit-{uuid.uuid4().hex}"
    app = _celery_app(url)
    app.conf.beat_schedule["tick"]["options"] = {"late_after": 5, "max_runtime": "long"}
    assert entries_app(app).code["tick"].options["late_after"] == 5
    scheduler = LeaderScheduler(app=app, lazy=True)
    adapter = scheduler._protocol.adapter
    assert isinstance(adapter, BeatAdapter)
    for _ in range(2):
        (job,) = scheduler.leader_jobs()
    bad = [r.getMessage() for r in caplog.records if "max_runtime" in r.getMessage()]
    assert bad == [
        "celery-leader: option max_runtime of entry 'tick' must be seconds above 0 (got 'long'); "
        "the console ignores it"
    ]
    applied: list[dict[str, Any]] = []
    monkeypatch.setattr(
        scheduler, "apply_entry", lambda entry, producer=None: applied.append(dict(entry.options))
    )
    adapter.send(job, "tick@x", T0, 1)
    assert applied and not {"late_after", "max_runtime"} & set(applied[0])
    scheduler.close()
    # Dramatiq: every() and cron() take them; the entries commands see them as options.
    with pytest.raises(ConfigError, match="late_after must be seconds above 0"):
        every(5, late_after=-1)
    broker = StubBroker()
    broker.add_middleware(LeaderMiddleware(url=url))

    @dramatiq.actor(broker=broker, leader_schedule=every(5, late_after=2, max_runtime=60))
    def work() -> None:
        pass

    with dramatiq_entries_of(broker) as entries:
        assert entries.app.code["work"].options == {"late_after": 2.0, "max_runtime": 60.0}
        entries.add("w", "work", every=5, options={"late_after": 1})
        assert entries.get("w").options == {"late_after": 1}  # type: ignore[union-attr]
    assert "late_after=2" in repr(every(5, late_after=2))


# -- the real command line --------------------------------------------------------------------

APP = """
from celery import Celery
app = Celery("ops_app", broker="memory://")
app.conf.leader_url = "file://{store}"
app.conf.beat_schedule = {{"tick": {{"task": "ops_app.tick", "schedule": 5.0}}}}

@app.task
def tick():
    pass
"""


def test_the_cli_pauses_until_with_a_reason_and_shows_pauses_limits_and_changes(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "ops_app.py").write_text(APP.format(store=store))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CELERY), "-A", "ops_app", "leader", "entries", *args],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    for args, message in [
        (("add", "b", "--task", "ops_app.tick", "--every", "5", "--late-after", "x"), "number"),
        (("add", "b", "--task", "ops_app.tick", "--every", "5", "--max-runtime", "0"), "above 0"),
        (("pause", "tick", "--until", "2001-01-01T00:00:00Z"), "is not in the future"),
        (("pause", "tick", "--until", "soon"), "ISO 8601"),
    ]:
        done = run(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    done = run(
        "add", "r", "--task", "ops_app.tick", "--every", "60",
        "--late-after", "30", "--max-runtime", "600", "--why", "new report", "--who", "ann",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # On the minute: the entry's grid.
    until = (datetime.now(timezone.utc) + timedelta(hours=2)).replace(second=0, microsecond=0)
    done = run("pause", "r", "--reason", "quarter close", "--until", until.isoformat())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"r: paused until {until.isoformat()}"
    assert run("pause", "tick", "--why", "noisy").returncode == 0
    listed = {r["name"]: r for r in json.loads(run("ls", "--json").stdout)}
    assert listed["r"]["enabled"] is False
    assert listed["r"]["paused_why"] == "quarter close"
    assert listed["r"]["paused_until"] == until.isoformat()
    assert "@" in listed["r"]["paused_by"], "user@host by default"
    # Next due: the first slot from the pause's end.
    assert datetime.fromisoformat(listed["r"]["next_due"]) == until
    assert listed["tick"]["paused_until"] is None and listed["tick"]["next_due"] is None
    table = run("ls").stdout
    assert f"until {until.isoformat()} by " in table and ": quarter close" in table
    assert "until resumed by " in table and ": noisy" in table
    shown = json.loads(run("show", "r", "--json").stdout)
    assert (shown["late_after"], shown["max_runtime"]) == (30.0, 600.0)
    assert shown["entry"]["options"] == {"late_after": 30.0, "max_runtime": 600.0}
    changes = shown["recent_changes"]
    assert [(c["action"], c["why"]) for c in changes] == [
        ("pause", "quarter close"),
        ("add", "new report"),
    ]
    assert changes[1]["who"] == "ann" and changes[0]["details"] == {"until": until.isoformat()}
    assert datetime.fromisoformat(changes[0]["at"]) <= datetime.now(timezone.utc)
    plain = run("show", "r").stdout
    assert "recent_changes: " in plain and "paused_why: quarter close" in plain
    done = run("resume", "r", "--why", "closed early", "--who", "bob")
    assert done.returncode == 0, done.stderr
    shown = json.loads(run("show", "r", "--json").stdout)
    assert shown["enabled"] is True and shown["paused_why"] is None
    assert shown["recent_changes"][0] == {
        **shown["recent_changes"][0],
        "action": "resume",
        "who": "bob",
        "why": "closed early",
    }
    assert run("rm", "r", "--why", "done").returncode == 0
    exported = tmp_path / "e.jsonl"
    exported.write_text(json.dumps({"name": "i", "task": "ops_app.tick", "every": 5}) + "\n")
    assert run("import", str(exported), "--why", "migration").returncode == 0
    shown = json.loads(run("show", "i", "--json").stdout)
    assert [(c["action"], c["why"]) for c in shown["recent_changes"]] == [("import", "migration")]


def test_the_dramatiq_command_line_takes_the_same_options(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    (tmp_path / "ops_actors.py").write_text(
        "import dramatiq\n"
        "from dramatiq.brokers.stub import StubBroker\n"
        "from celery_leader.dramatiq import LeaderMiddleware, every\n"
        "broker = StubBroker()\n"
        f"broker.add_middleware(LeaderMiddleware(url={url!r}))\n"
        "dramatiq.set_broker(broker)\n"
        "@dramatiq.actor(leader_schedule=every(5, late_after=3))\n"
        "def tick():\n    pass\n"
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery_leader", "entries", "--app", "ops_actors", *args],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path), "CELERY_LEADER_URL": url},
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = run("add", "w", "--task", "tick", "--every", "5", "--max-runtime", "9", "--why", "w")
    assert done.returncode == 0, done.stderr
    until = (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)
    done = run("pause", "tick", "--reason", "r", "--until", until.isoformat(), "--who", "ann")
    assert done.returncode == 0, done.stderr
    shown = json.loads(run("show", "tick", "--json").stdout)
    assert (shown["paused_by"], shown["paused_why"]) == ("ann", "r")
    assert (shown["late_after"], shown["max_runtime"]) == (3.0, None)
    assert shown["recent_changes"][0]["action"] == "pause"
    shown = json.loads(run("show", "w", "--json").stdout)
    assert shown["max_runtime"] == 9.0 and shown["recent_changes"][0]["why"] == "w"
    assert run("resume", "tick", "--why", "ok").returncode == 0


@pytest.mark.mariadb
def test_the_trail_on_mysql_from_the_cli_the_api_and_the_console(
    tmp_path: Path, mariadb_url: str
) -> None:
    """On a real MariaDB: changes made by the ``celery`` command and by the Python API are
    in the trail, newest first, with who and why; the console's entry view lists the same;
    each log keeps its newest ``leader_audit_keep`` records."""
    app_text = APP.replace('"file://{store}"', '"{store}"') + "app.conf.leader_audit_keep = 3\n"
    (tmp_path / "ops_app.py").write_text(app_text.format(store=mariadb_url))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CELERY), "-A", "ops_app", "leader", "entries", *args],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = run("add", "r", "--task", "ops_app.tick", "--every", "60", "--why", "new report",
               "--who", "ann")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert run("pause", "r", "--reason", "quarter close", "--who", "bob").returncode == 0
    assert run("resume", "r", "--why", "closed early").returncode == 0
    shown = json.loads(run("show", "r", "--json").stdout)["recent_changes"]
    assert [(c["action"], c["who"], c["why"]) for c in shown][1:] == [
        ("pause", "bob", "quarter close"),
        ("add", "ann", "new report"),
    ]
    assert shown[0]["action"] == "resume" and "@" in shown[0]["who"], "user@host by default"

    celery_app = _celery_app(mariadb_url, leader_audit_keep=3)
    celery_entries_of(celery_app).pause("r", why="from the API", who="api")
    trail = json.loads(run("show", "r", "--json").stdout)["recent_changes"]
    assert [(c["action"], c["why"]) for c in trail] == [
        ("pause", "from the API"),
        ("resume", "closed early"),
        ("pause", "quarter close"),
    ], "the add dropped: the entry's log keeps 3"

    console = console_app(entries_app(celery_app))
    try:
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/api/entries/r", "QUERY_STRING": "",
                   "HTTP_HOST": "127.0.0.1:5555", "SERVER_NAME": "127.0.0.1",
                   "SERVER_PORT": "5555", "REMOTE_ADDR": "127.0.0.1",
                   "wsgi.url_scheme": "http"}  # fmt: skip
        status: list[str] = []
        body = b"".join(console(environ, lambda s, h, *_: status.append(s)))
    finally:
        console.close()
    assert status == ["200 OK"], body[:300]
    audit = json.loads(body)["audit"]
    assert [(a["action"], a["who"], a["why"]) for a in audit] == [
        (c["action"], c["who"], c["why"]) for c in trail
    ]
    assert [a["at"][:19] for a in audit] == [c["at"][:19] for c in trail]
