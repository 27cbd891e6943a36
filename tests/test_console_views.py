"""What the console's views compute, in this process on the memory store: fire times
and their clock-change flags, the schedule in words, the entries list at 100,000
entries, the problem states, and the hand-over gaps of the timeline."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from celery_leader.backends import HolderInfo, JournalWrite, RunWrite, StoreFacets, open_store
from celery_leader.cli.entries import CodeEntry, EntriesApp, ScheduleEntries
from celery_leader.console import pages, plan, timeline
from celery_leader.console.listing import EntryCache, EntryIndex, page_of
from celery_leader.console.problems import Limits, state_of
from celery_leader.console.reads import Reads, iso
from celery_leader.console.times import AFTER_CHANGE, MOVED, REPEATED, in_words, next_fires
from celery_leader.console.upcoming import DueTimes
from celery_leader.election.history import TERMS, TERMS_KEPT, TermRecord, term_key
from celery_leader.ledger.marks import mark_sent
from celery_leader.ledger.records import TALLIES, RunRecord
from celery_leader.ledger.summary import EntryRuns
from celery_leader.schedule import plan as planning
from celery_leader.schedule.entries import new_entry, parse_cron
from celery_leader.schedule.jobs import Job
from celery_leader.schedule.run_request import run_slot
from celery_leader.schedule.series import Every
from celery_leader.schedule.state import slot_name
from celery_leader.settings.config import LeaderConfig

BERLIN = ZoneInfo("Europe/Berlin")
UTC = timezone.utc


# -- times ----------------------------------------------------------------------------


def test_a_slot_the_spring_forward_skips_is_flagged_moved() -> None:
    series = parse_cron("30 2 * * *", BERLIN)
    fires = next_fires(series, BERLIN, datetime(2027, 3, 27, 12, tzinfo=UTC))
    assert [f.local.isoformat() for f in fires] == [
        "2027-03-28T03:00:00+02:00",  # 02:30 does not exist: at the jump
        "2027-03-29T02:30:00+02:00",
        "2027-03-30T02:30:00+02:00",
    ]
    assert [f.dst for f in fires] == [MOVED, None, None]
    assert fires[0].utc == datetime(2027, 3, 28, 1, tzinfo=UTC)


def test_a_slot_in_the_repeated_hour_is_flagged() -> None:
    series = parse_cron("30 2 * * *", BERLIN)
    fires = next_fires(series, BERLIN, datetime(2027, 10, 30, 12, tzinfo=UTC))
    assert fires[0].local.isoformat() == "2027-10-31T02:30:00+02:00"  # the first of two
    assert [f.dst for f in fires] == [REPEATED, AFTER_CHANGE, None]


def test_the_first_hourly_slot_after_a_clock_change_is_flagged() -> None:
    series = parse_cron("0 * * * *", BERLIN)
    fires = next_fires(series, BERLIN, datetime(2027, 3, 28, 0, 30, tzinfo=UTC))
    assert [f.local.hour for f in fires] == [3, 4, 5]  # 02:00 never happens
    assert [f.dst for f in fires] == [AFTER_CHANGE, None, None]


def test_an_every_entry_in_utc_has_no_flag() -> None:
    fires = next_fires(Every(timedelta(minutes=5)), UTC, datetime(2027, 3, 28, 0, 59, tzinfo=UTC))
    assert [f.utc.minute for f in fires] == [0, 5, 10] and {f.dst for f in fires} == {None}


@pytest.mark.parametrize(
    ("series", "words"),
    [
        (Every(timedelta(seconds=10)), "every 10 seconds"),
        (Every(timedelta(minutes=5)), "every 5 minutes"),
        (Every(timedelta(hours=1)), "every hour"),
        (Every(timedelta(seconds=1.5)), "every 1.5 seconds"),
        (parse_cron("*/15 * * * *", ZoneInfo("UTC")), "every 15 minutes (UTC)"),
        (parse_cron("30 2 * * *", BERLIN), "at 02:30, daily (Europe/Berlin)"),
        (parse_cron("0 9 * * 1-5", BERLIN), "at 09:00, on Mon, Tue, Wed, Thu, Fri (Europe/Berlin)"),
        (parse_cron("* * * * *", ZoneInfo("UTC")), "every minute (UTC)"),
        (None, "only its framework can tell"),
    ],
)
def test_the_schedule_in_words(series: Any, words: str) -> None:
    assert in_words(series) == words


# -- the entries list at volume -------------------------------------------------------


def _app(**settings: Any) -> EntriesApp:
    prefix = f"views-{uuid.uuid4().hex}"
    config = LeaderConfig.from_mapping(
        {"leader_url": "memory://", "leader_key_prefix": prefix, **settings}
    )
    code = {"tick": CodeEntry("proj.tick", "every 1s", Every(timedelta(seconds=1)))}
    return EntriesApp(config, code, {"proj.tick"})


def _records(count: int) -> dict[str, str]:
    """``count`` store entries; every 1000th sends ``proj.special``, every 500th is paused."""
    now = datetime.now(UTC)
    plain = new_entry(now, name="NAME", task="proj.report", every=60).to_json()
    special = plain.replace('"proj.report"', '"proj.special"')
    records = {}
    for i in range(count):
        text = special if i % 1000 == 0 else plain
        if i % 500 == 0:
            text = text.replace('"enabled":true', '"enabled":false')
        records[f"e{i:06d}"] = text.replace('"name":"NAME"', f'"name":"e{i:06d}"')
    return records


def test_a_page_of_100000_entries_parses_only_its_rows() -> None:
    index = EntryIndex(_app(), _records(100_000))
    listing = page_of(index, index.names, 3, 50)
    assert (listing.total, listing.pages, listing.page) == (100_001, 2001, 3)
    assert [row["name"] for row in listing.rows][:2] == ["e000100", "e000101"]
    assert len(index._parsed) == 50, "only the page's rows are parsed"
    last = page_of(index, index.names, 10_000, 50)
    assert last.page == 2001 and [row["name"] for row in last.rows] == ["tick"]


def test_a_search_and_the_paused_filter_parse_only_what_may_match() -> None:
    index = EntryIndex(_app(), _records(100_000))
    found = index.search("SPECIAL")
    assert len(found) == 100 and found[0] == "e000000"
    assert len(index._parsed) == 100
    assert index.search("e09999") == [f"e09999{i}" for i in range(10)]
    assert index.search("proj.tick") == ["tick"]
    paused = index.paused(index.names)
    assert len(paused) == 200 and paused[1] == "e000500"
    assert len(index._parsed) <= 300


# -- problem states -------------------------------------------------------------------


def _runs(state: str, started: float | None, slot: str, outcome: str | None = None) -> EntryRuns:
    return EntryRuns("x", slot, state, "w", started, None, None, outcome, 1)


def test_the_problem_states() -> None:
    now = time.time()
    every = Every(timedelta(seconds=60))
    due = datetime.fromtimestamp(now - 600, UTC).replace(microsecond=0)
    slot = slot_name("x", due)
    limits = Limits(late_after=30, max_runtime=100)
    assert state_of(False, every, None, limits, now) == "paused"
    assert state_of(True, every, None, limits, now) == "on time"
    assert state_of(True, every, _runs("running", now - 10, slot), limits, now) == "running"
    assert state_of(True, every, _runs("running", now - 200, slot), limits, now) == "overrun"
    assert state_of(True, every, _runs("running", now - 200, slot), Limits(), now) == "running"
    failed = _runs("finished", now - 500, slot, "failure")
    assert state_of(True, every, failed, limits, now) == "failed"
    assert state_of(True, every, _runs("abandoned", now - 500, slot), limits, now) == "failed"
    assert state_of(True, every, _runs("sent", now - 590, slot), limits, now) == "late"
    done = _runs("finished", now - 590, slot, "success")
    assert state_of(True, every, done, limits, now) == "missed"  # nothing for 9 slots since
    assert state_of(True, every, done, Limits(), now) == "on time"  # no late_after: never
    assert Limits.of({"late_after": "soon", "max_runtime": True}) == Limits()


def _finished(store: StoreFacets, entry: str, due: datetime, outcome: str) -> None:
    slot = slot_name(entry, due)
    start = due.timestamp() + 0.1
    record = RunRecord(slot, "started", "w1", 1, start, start + 60).ended(start + 0.5, outcome)
    store.runs.put("beat", RunWrite(slot, None, record.dump(), 3600, 100, TALLIES[outcome]))


def test_problems_and_the_failing_filter_read_the_ledger() -> None:
    app = _app()
    store = open_store(app.config)
    now = datetime.now(UTC).replace(microsecond=0)
    _finished(store, "tick", now - timedelta(seconds=3), "failure")
    data = pages.problems(Reads(app, store))
    assert data["counts"]["failed"] == 1 and data["entries"][0]["name"] == "tick"
    failing = pages.entries(Reads(app, store), selected="failing")
    assert [row["name"] for row in failing["entries"]] == ["tick"]
    assert pages.metrics(data).count('celery_leader_entries{state="failed"} 1') == 1
    _finished(store, "tick", now - timedelta(seconds=2), "success")
    _finished(store, "tick", now - timedelta(seconds=1), "success")
    one = pages.entry(Reads(app, store), "tick")
    assert one is not None and one["state"] == "on time"
    assert [run["state"] for run in one["runs"]] == ["success", "success", "failure"]
    assert one["p50"] == 0.5 and one["p95"] == 0.5
    assert one["runs"][0]["lag"] == 0.1 and one["runs"][0]["worker"] == "w1"
    store.close()


def test_a_run_now_is_listed_by_when_it_was_sent_for() -> None:
    """A run now's slot names no due time: its row says when it was sent for, and its
    lag counts from then."""
    sent = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    slot = run_slot("tick", sent)
    record = RunRecord(slot, "started", "w1", 1, sent.timestamp() + 0.25, sent.timestamp() + 60)
    row = pages.run_row(slot, record.ended(sent.timestamp() + 1, "success").dump())
    assert (row["due"], row["run_now"], row["lag"]) == (None, sent.isoformat(), 0.25)
    assert pages.run_row(slot_name("tick", sent), record.dump())["run_now"] is None


# -- the timeline ---------------------------------------------------------------------


def test_the_timeline_shows_the_gap_of_a_hand_over_and_its_slots() -> None:
    app = _app()
    store = open_store(app.config)
    t0 = float(int(time.time()) - 100)
    terms = [
        TermRecord(7, "beat-1", t0, t0 + 10.2, "expired"),
        TermRecord(8, "beat-2", t0 + 14.5),
    ]
    store.journal.write(
        "beat", [JournalWrite(TERMS, term_key(t.epoch), t.dump(), TERMS_KEPT) for t in terms]
    )
    late = datetime.fromtimestamp(t0 + 12, UTC)
    mark_sent(store.runs, "beat", slot_name("tick", late), "beat-2", 3600, 100)
    data = timeline.timeline(Reads(app, store))
    newest, oldest = data["terms"]
    assert (newest["holder"], newest["how"], newest["gap"]) == ("beat-2", "leading", 4.3)
    assert (oldest["holder"], oldest["how"], oldest["gap"]) == ("beat-1", "expired", None)
    fates = {slot["due"][11:19]: slot["fate"] for slot in newest["gap_slots"]}
    assert len(fates) == 4  # due at 11, 12, 13 and 14 s
    assert fates[late.isoformat()[11:19]] == "sent late, by the next leader"
    assert sorted(set(fates.values())) == [
        "not sent: dropped by the missed-slot policy, or not recorded",
        "sent late, by the next leader",
    ]
    store.close()


def test_the_entries_are_read_again_only_when_their_version_moved() -> None:
    app = _app()
    store = open_store(app.config)
    cache = EntryCache(app)
    first = cache.index(store.entries, "beat")
    assert cache.index(store.entries, "beat") is first
    with ScheduleEntries(app) as entries:
        entries.add("report", "proj.tick", every=60)
    again = cache.index(store.entries, "beat")
    assert again is not first and again.names == ["report", "tick"]
    assert cache.index(store.entries, "beat") is again
    store.close()


def test_the_gap_after_a_lost_term_is_bounded_by_the_ttl() -> None:
    """A holder that crashed never wrote its end: it renewed within a ttl of the next
    term's start, so the gap is at most that."""
    app = _app(leader_ttl=3)
    store = open_store(app.config)
    t0 = float(int(time.time()) - 100)
    terms = [TermRecord(7, "beat-1", t0, None, "lost"), TermRecord(8, "beat-2", t0 + 50)]
    store.journal.write(
        "beat", [JournalWrite(TERMS, term_key(t.epoch), t.dump(), TERMS_KEPT) for t in terms]
    )
    newest = timeline.timeline(Reads(app, store))["terms"][0]
    assert (newest["gap"], newest["gap_exact"]) == (3.0, False)
    assert len(newest["gap_slots"]) == 3  # tick, every second
    store.close()


def test_the_plan_lists_a_window_and_marks_its_busiest_seconds() -> None:
    app = _app()
    store = open_store(app.config)
    with ScheduleEntries(app) as entries:
        entries.add("minutely", "proj.tick", every=60)
        entries.add("off", "proj.tick", every=60, enabled=False)
    data = plan.plan(
        Reads(app, store), "2027-01-01T00:00:00Z", "2027-01-01T00:03:00Z", "Europe/Berlin"
    )
    assert data["total"] == 180 + 3 and {s["entry"] for s in data["slots"]} == {"tick", "minutely"}
    assert [b["slots"] for b in data["busiest"]] == [2, 2, 2]
    busy = [s["due"] for s in data["slots"] if s["busy"]]
    assert len(busy) == 6 and busy[0] == "2027-01-01T00:01:00.000+00:00"
    assert data["slots"][0]["local"].endswith("+01:00")
    with pytest.raises(ValueError, match="unknown time zone"):
        plan.plan(Reads(app, store), tz="Mars/Olympus")
    store.close()


# -- the cluster ----------------------------------------------------------------------


def test_the_cluster_lists_the_replicas_of_the_term_history() -> None:
    """The replicas the store knows of are the holders of the election's last terms:
    the one leading first, then the latest to lead, each with its latest term."""
    app = _app()
    store = open_store(app.config)
    t0 = float(int(time.time()) - 100)
    terms = [
        TermRecord(7, "beat-1", t0, t0 + 10, "resigned"),
        TermRecord(8, "beat-2", t0 + 11, None, "lost"),
        TermRecord(9, "beat-1", t0 + 20, t0 + 30, "expired"),
        TermRecord(10, "beat-3", t0 + 31, t0 + 40, "stopping"),
    ]
    store.journal.write(
        "beat", [JournalWrite(TERMS, term_key(t.epoch), t.dump(), TERMS_KEPT) for t in terms]
    )
    term = store.lock.acquire("beat", "beat-2", 30, 11).term
    assert term is not None
    rows = {row["election"]: row for row in pages.cluster(Reads(app, store))["elections"]}
    replicas = rows["beat"]["replicas"]
    assert [(r["instance"], r["leads"], r["terms"], r["last_epoch"]) for r in replicas] == [
        ("beat-2", True, 2, term.epoch),  # leads, its new term's record not written here
        ("beat-3", False, 1, 10),
        ("beat-1", False, 2, 9),
    ]
    assert (replicas[0]["last_how"], replicas[0]["last_ended"]) == ("leading", None)
    assert (replicas[2]["last_how"], replicas[2]["last_ended"]) == ("expired", iso(t0 + 30))
    assert rows[app.config.worker_election]["replicas"] == []
    store.close()


def test_replicas_when_the_holders_term_is_recorded() -> None:
    holder = HolderInfo("a", 3, 10.0, since=1.0)
    assert pages.replicas([TermRecord(3, "a", 1.0), TermRecord(2, "b", 0.5, None)], holder) == [
        {"instance": "a", "leads": True, "terms": 1, "last_epoch": 3,
         "last_started": "1970-01-01T00:00:01.000+00:00", "last_ended": None,
         "last_how": "leading"},
        {"instance": "b", "leads": False, "terms": 1, "last_epoch": 2,
         "last_started": "1970-01-01T00:00:00.500+00:00", "last_ended": None,
         "last_how": "unknown"},
    ]  # fmt: skip
    assert pages.replicas([TermRecord(3, "a", 1.0)], None)[0]["last_how"] == "unknown"


# -- the plan at volume ---------------------------------------------------------------


def _plan_records() -> dict[str, str]:
    """Entries of every kind of series: crons in two zones, every few seconds, paused
    with and without an end, and one that ended."""
    now = datetime.now(UTC)
    soon = now + timedelta(minutes=20)
    made = [
        new_entry(now, name="berlin", task="t", cron="*/7 * * * *", tz="Europe/Berlin"),
        new_entry(now, name="utc", task="t", cron="5,17 * * * *"),
        new_entry(now, name="fast", task="t", every=13),
        new_entry(now, name="slow", task="t", every=3600),
        new_entry(now, name="off", task="t", every=5, enabled=False),
        new_entry(now, name="back", task="t", every=11, enabled=False, paused_until=soon),
        new_entry(now, name="ended", task="t", every=5, end_at=now - timedelta(days=1)),
    ]
    return {entry.name: entry.to_json() for entry in made}


def _expected(index: EntryIndex, start: datetime, end: datetime) -> list[tuple[str, str]]:
    """The slots ``leader plan`` lays out for the entries enabled now, and for the one
    whose pause ends, those from its end on."""
    jobs, resumes = [], {}
    for name in index.names:
        found = index.get(name)
        assert found is not None and found.series is not None
        if not found.enabled:
            assert found.stored is not None
            if found.stored.paused_until is None:
                continue
            resumes[name] = found.stored.paused_until
        jobs.append(Job(name, found.series, "all", None, index.zone))
    slots = planning.plan(jobs, start, end).slots
    assert slots and list(resumes) == ["back"]
    return sorted(
        (s.due.isoformat(), s.entry) for s in slots if s.due >= resumes.get(s.entry, s.due)
    )


def test_the_plan_window_lists_what_a_full_plan_lays_out() -> None:
    index = EntryIndex(_app(), _plan_records())
    times = DueTimes(index, datetime.now(UTC))
    now = datetime.now(UTC)
    for start, hours in ((now, 1), (now + timedelta(minutes=3), 2), (now - timedelta(hours=5), 3),
                         (now + timedelta(days=3), 1)):  # fmt: skip
        end = start + timedelta(hours=hours)
        window = times.window(start, end, 100_000)
        listed = sorted((s.due.isoformat(), s.entry) for s in window.slots)
        assert listed == _expected(index, start, end), start
        assert not window.more and [s.due for s in window.slots] == sorted(
            s.due for s in window.slots
        )
        first = times.window(start, end, 50)
        assert first.more and first.slots == window.slots[:50]


def test_the_plan_costs_the_slots_it_lists_at_100000_entries(monkeypatch: Any) -> None:
    """After the index is laid out (a step per entry, once per read of the entries), a
    plan takes a step per slot listed and per entry due since the last plan; after an
    edit, only the edited entry is parsed again."""
    app = _app()
    records = {
        name: text.replace('"every":60', f'"every":{60 + i % 240}')
        for i, (name, text) in enumerate(_records(100_000).items())
    }
    index = EntryIndex(app, records)
    now = datetime.now(UTC)
    times = DueTimes(index, now)
    steps = [0]
    after = Every.next_after

    def counted(self: Every, moment: datetime) -> datetime:
        steps[0] += 1
        return after(self, moment)

    monkeypatch.setattr(Every, "next_after", counted)
    window = times.window(now + timedelta(seconds=1), now + timedelta(hours=1), 1000)
    assert len(window.slots) == 1000 and window.more
    assert steps[0] < 6000, steps  # the entries due in that second, and the 1000 listed
    edited = dict(records, e000007=records["e000007"].replace('"every":67', '"every":99'))
    again = EntryIndex(app, edited)
    steps[0] = 0
    moved = DueTimes(again, datetime.now(UTC), times)
    assert len(again._parsed) == 1 and steps[0] == 1
    listed = moved.window(now + timedelta(seconds=2), now + timedelta(seconds=300), 10**5)
    assert "e000007" in {s.entry for s in listed.slots}
