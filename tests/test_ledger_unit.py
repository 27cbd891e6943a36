"""The run ledger's rules on the in-process store: decisions, overlap marks, summary, settings."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
import sentry_sdk
from celery import Celery
from sentry_sdk import transport as sentry_transport
from sentry_sdk.envelope import Envelope

from celery_leader.backends import RunStore, open_store
from celery_leader.cli import commands as ops
from celery_leader.clock import SYSTEM_CLOCK
from celery_leader.exceptions import ConfigError
from celery_leader.ledger import LedgerTarget, RunGuard, RunRecord, marks
from celery_leader.ledger.crons import SentryCrons, monitor_slug
from celery_leader.ledger.records import WORKERS
from celery_leader.ledger.summary import summarize
from celery_leader.probes.shared_counters import ENV_VAR, SharedCounters
from celery_leader.schedule.jobs import Job, Outcome
from celery_leader.schedule.resend import Resender
from celery_leader.settings.config import LeaderConfig
from harness.waiting import wait_for
from tests import ledger_reads

TTL = 0.3
SLOT = "report@2026-01-01T00:00:00.000+00:00"


@pytest.fixture
def store() -> RunStore:
    config = LeaderConfig.from_mapping({"leader_url": f"memory://ledger-{uuid.uuid4().hex}"})
    return open_store(config).runs


def guard(store: RunStore, who: str, on_redelivery: str = "rerun") -> RunGuard:
    target = LedgerTarget(store, "beat", who, TTL, TTL / 3, 3600, 10)
    return RunGuard(target, on_redelivery)


def record(store: RunStore, slot: str = SLOT) -> RunRecord:
    text = ledger_reads.record(store, slot)
    loaded = None if text is None else RunRecord.load(text, slot)
    assert loaded is not None
    return loaded


def test_the_first_delivery_runs_and_later_ones_do_not(store: RunStore) -> None:
    a, b = guard(store, "a"), guard(store, "b", on_redelivery="skip")
    assert a.begin(SLOT).run
    running = b.begin(SLOT)
    assert not running.run and running.counter == "ledger_duplicates"
    assert "running on a" in running.why
    a.finish(SLOT, "success")
    done = b.begin(SLOT)
    assert not done.run and "ran already (success on a)" in done.why
    r = record(store)
    assert (r.status, r.outcome, r.worker, r.attempt) == ("finished", "success", "a", 1)


def test_liveness_is_renewed_while_the_body_runs(store: RunStore) -> None:
    # On a wall clock the test moves: each step is half a ttl, and the next waits
    # for the renewal made after it, so the record is alive at every instant the
    # clock shows however late the renewer thread runs on a loaded machine.
    now = [1_767_225_600.0]
    target = LedgerTarget(store, "beat", "a", TTL, TTL / 3, 3600, 10, clock=lambda: now[0])
    a = RunGuard(target, "rerun")
    assert a.begin(SLOT).run
    first_ttl_ends = record(store).alive_until
    while now[0] <= first_ttl_ends:
        last = record(store).alive_until
        now[0] += TTL / 2
        assert record(store).alive(now[0])
        wait_for(lambda: record(store).alive_until > last, 5, message="not renewed")
    assert record(store).alive(now[0]), "renewed past its first ttl"
    a.finish(SLOT, "failure")
    assert record(store).outcome == "failure"


def test_a_dead_workers_slot_reruns_once_with_rerun(store: RunStore) -> None:
    dead = guard(store, "dead")
    assert dead.begin(SLOT).run
    dead.release(SLOT)  # stops renewing, as a killed worker would
    time.sleep(TTL + 0.05)
    again = guard(store, "b").begin(SLOT)
    assert again.run and again.counter == "ledger_reruns"
    assert (record(store).worker, record(store).attempt) == ("b", 2)
    assert not guard(store, "c").begin(SLOT).run, "and only once"


def test_a_dead_workers_slot_is_recorded_skipped_with_skip(store: RunStore) -> None:
    dead = guard(store, "dead")
    assert dead.begin(SLOT).run
    dead.release(SLOT)
    time.sleep(TTL + 0.05)
    skipped = guard(store, "b", on_redelivery="skip").begin(SLOT)
    assert not skipped.run and skipped.counter == "ledger_skips"
    r = record(store)
    assert (r.status, r.outcome) == ("finished", "skipped") and "dead died" in (r.reason or "")


def test_rerun_waits_out_a_liveness_that_may_belong_to_a_dead_worker(store: RunStore) -> None:
    dead = guard(store, "dead")
    assert dead.begin(SLOT).run
    dead.release(SLOT)
    started = time.monotonic()
    assert guard(store, "b").begin(SLOT).run, "its liveness lapsed while b waited"
    assert time.monotonic() - started < TTL + 1


def test_a_retry_takes_over_its_started_record(store: RunStore) -> None:
    a = guard(store, "a")
    assert a.begin(SLOT).run
    a.release(SLOT)  # the attempt ended in a retry
    assert guard(store, "b").begin(SLOT, retry=True).run
    assert record(store).attempt == 2


def test_beats_sent_mark_is_taken_over_by_the_first_worker(store: RunStore) -> None:
    assert marks.mark_sent(store, "beat", SLOT, "beat-1", 3600, 10)
    assert not marks.mark_sent(store, "beat", SLOT, "beat-2", 3600, 10), "sent once"
    assert guard(store, "a").begin(SLOT).run
    assert not guard(store, "b", "skip").begin(SLOT).run
    assert summarize(store.summaries("beat"), time.time())[0].state == "running"


def test_overlap_skip_and_wait(store: RunStore) -> None:
    a, b = guard(store, "a"), guard(store, "b")
    first, second, third = (f"report@2026-01-01T00:0{i}:00.000+00:00" for i in range(3))
    assert a.begin(first, overlap="skip").run
    skipped = b.begin(second, overlap="skip")
    assert not skipped.run and "still running" in skipped.why
    assert record(store, second).outcome == "skipped"
    waited = b.begin(third, overlap="wait", overlap_wait=0.2)
    assert not waited.run, "the first still runs after the bound"
    a.finish(first, "success")
    fourth = "report@2026-01-01T00:04:00.000+00:00"
    assert b.begin(fourth, overlap="wait", overlap_wait=5).run, "free once the first ended"
    runs = summarize(store.summaries("beat"), time.time())
    assert [(s.entry, s.last_slot, s.runs, s.skips) for s in runs] == [("report", fourth, 2, 2)]


def test_a_dead_workers_run_stops_blocking_once_its_liveness_lapses(store: RunStore) -> None:
    dead = guard(store, "dead")
    first, second = (f"report@2026-01-01T00:0{i}:00.000+00:00" for i in range(2))
    assert dead.begin(first, overlap="skip").run
    dead.release(first)
    dead.marks._held.clear()  # a killed worker renews nothing
    time.sleep(TTL + 0.05)
    assert guard(store, "b").begin(second, overlap="skip").run


def test_settings() -> None:
    config = LeaderConfig.from_mapping({"leader_url": "memory://"})
    assert (config.ledger, config.on_redelivery, config.overlap) == (True, "rerun", "allow")
    assert (config.ledger_retention, config.ledger_keep) == (2 * 86400, 10_000)
    assert config.ledger_resend_after == 3600
    env = {"CELERY_LEADER_URL": "memory://", "CELERY_LEADER_LEDGER_KEEP": "50"}
    assert LeaderConfig.from_env(env).ledger_keep == 50
    never = {"CELERY_LEADER_URL": "memory://", "CELERY_LEADER_LEDGER_RESEND_AFTER": "0"}
    assert LeaderConfig.from_env(never).ledger_resend_after == 0
    for key, value, says in [
        ("leader_ledger_keep", 0, "leader_ledger_keep must be at least 1"),
        ("leader_ledger_keep", 2.5, "leader_ledger_keep must be a whole number"),
        ("leader_on_redelivery", "again", "leader_on_redelivery"),
        ("leader_overlap", "never", "leader_overlap"),
        ("leader_ledger_retention", 60, "at least 60 x leader_ttl"),
        ("leader_overlap_wait", -1, "leader_overlap_wait"),
        ("leader_ledger_resend_after", -1, "resend_after must be a number of seconds, or 0 for"),
        ("leader_ledger_resend_after", "soon", "resend_after must be a number of seconds, or 0"),
    ]:
        with pytest.raises(ConfigError, match=says):
            LeaderConfig.from_mapping({"leader_url": "memory://", key: value})


def test_leader_status_shows_each_entrys_last_slot() -> None:
    url = f"memory://ledger-{uuid.uuid4().hex}"
    config = LeaderConfig.from_mapping({"leader_url": url, "leader_ledger": True})
    store = open_store(config).runs
    g = guard(store, "w1")
    assert g.begin(SLOT).run
    g.finish(SLOT, "failure")
    lines: list[str] = []
    ops.status(config, lines.append)
    table = "\n".join(lines)
    assert "run ledger, the last slot of each entry:" in table
    (row,) = [line for line in lines if line.startswith(SLOT)]
    assert row.split()[1:3] == ["finished", "failure"], row
    assert row.split()[-3:] == ["1", "1", "0"], "runs, failed, skipped"
    out: list[str] = []
    ops.status(config, out.append, as_json=True)
    (entry,) = json.loads(out[0])["entries"]
    assert (entry["entry"], entry["outcome"], entry["failures"]) == ("report", "failure", 1)


class _Sends:
    """An adapter stand-in that records what beat (re-)sends; ``expired``: every message
    has expired by the time it is looked at again."""

    def __init__(self, expired: bool = False) -> None:
        self.sent: list[str] = []
        self._expired = expired

    def send(self, job: object, slot: str, due: object, epoch: int) -> Outcome:
        self.sent.append(slot)
        return Outcome()

    def expired(self, job: object, age: float) -> bool:
        return self._expired


JOB = Job("report", None, "once", None)
DUE = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_a_publish_of_unknown_outcome_is_resent_only_while_workers_deduplicate(
    store: RunStore,
) -> None:
    lease = SimpleNamespace(election="beat", instance_id="beat-1", ttl=60, clock=SYSTEM_CLOCK)
    adapter = _Sends()
    resender = Resender(lease, store, adapter, 3600, 10, logging.getLogger("test"), 0)  # type: ignore[arg-type]
    # No worker with the dedup step: the slot stays claimed, as with the ledger off.
    resender.unknown(None, SLOT, DUE)  # type: ignore[arg-type]
    resender.retry(epoch=1)
    assert adapter.sent == []
    assert ledger_reads.record(store, SLOT) is None
    # A worker registered (its mark lives a few ttl): the next one is re-sent once.
    marks.touch(store, "beat", WORKERS, {"worker": "w1"}, 60)
    resender.unknown(None, SLOT, DUE)  # type: ignore[arg-type]
    resender.retry(epoch=1)
    resender.unknown(None, SLOT, DUE)  # type: ignore[arg-type]
    resender.retry(epoch=1)
    assert adapter.sent == [SLOT]


def test_beat_marks_slots_sent_only_while_workers_deduplicate(store: RunStore) -> None:
    start = 1000.0
    now = [start]
    clock = SimpleNamespace(monotonic=lambda: now[0])  # moved by hand
    lease = SimpleNamespace(election="beat", instance_id="beat-1", ttl=TTL, clock=clock)
    resender = Resender(lease, store, _Sends(), 3600, 10, logging.getLogger("test"), 0)  # type: ignore[arg-type]
    resender.sent(JOB, SLOT, DUE, 5)  # nobody would drop a re-sent copy: no mark, no round trip
    assert ledger_reads.slot_records(store) == {}
    marks.touch(store, "beat", WORKERS, {"worker": "w1"}, 60)
    now[0] = start + TTL / 2
    resender.sent(JOB, SLOT, DUE, 5)  # the answer is kept one ttl: nobody registered yet
    assert SLOT not in ledger_reads.slot_records(store)
    now[0] = start + TTL
    resender.sent(JOB, SLOT, DUE, 5)
    assert record(store).status == "sent"


class _Watching:
    """A leader's resender with a hand-moved clock, ``leader_ledger_resend_after`` 60 s,
    and a worker with the dedup step registered."""

    def __init__(self, store: RunStore, expired: bool = False) -> None:
        self.now = 1000.0
        clock = SimpleNamespace(monotonic=lambda: self.now)
        lease = SimpleNamespace(election="beat", instance_id="beat-1", ttl=TTL, clock=clock)
        self.adapter = _Sends(expired)
        keeping = (3600, 100, logging.getLogger("test"), 60)  # 100 runs kept per entry
        self.resender = Resender(lease, store, self.adapter, *keeping)  # type: ignore[arg-type]
        marks.touch(store, "beat", WORKERS, {"worker": "w1"}, 3600)

    def send(self, slot: str = SLOT) -> None:
        self.resender.sent(JOB, slot, DUE, 5)

    def tick(self, after: float, job: Job | None = JOB) -> list[str]:
        """Move the clock ``after`` seconds on and tick with ``job`` as the entry's job now
        (``None``: gone): what was re-sent since the start."""
        self.now += after
        self.resender.unstarted({} if job is None else {job.name: job}, 7)
        return self.adapter.sent


def _slot(second: int) -> str:
    return f"report@2026-01-01T00:{second // 60:02}:{second % 60:02}.000+00:00"


def test_a_lone_slot_no_worker_started_is_sent_again_once_after_resend_after(
    store: RunStore,
) -> None:
    leader = _Watching(store)
    leader.send()
    assert leader.tick(59) == [], "not before leader_ledger_resend_after"
    assert leader.tick(1) == [SLOT]
    again = record(store)
    assert (again.status, again.epoch) == ("sent", 7), "the mark taken over by the re-send"
    assert leader.tick(3600) == [SLOT], "once"
    assert guard(store, "w1").begin(SLOT).run, "the copy runs"


def test_a_slot_a_later_one_overtook_is_missed_and_the_policy_decides() -> None:
    for policy, resent in [("once", []), ("skip", []), ("all", [_slot(0)])]:
        store = open_store(
            LeaderConfig.from_mapping({"leader_url": f"memory://ledger-{uuid.uuid4().hex}"})
        ).runs
        leader = _Watching(store)
        job = dataclasses.replace(JOB, missed_slots=policy)
        leader.send(_slot(0))  # lost by the broker
        leader.send(_slot(1))
        assert guard(store, "w1").begin(_slot(1)).run
        assert leader.tick(4.9, job) == [], "the later slot's 5 s to start"
        assert leader.tick(0.1, job) == resent, policy
        assert leader.tick(3600, job) == resent, f"{policy}: judged once"


def test_slots_workers_started_are_not_sent_again(store: RunStore) -> None:
    leader = _Watching(store)
    g = guard(store, "w1")
    for n in range(3):
        leader.send(_slot(n))
        assert g.begin(_slot(n)).run
    g.finish(_slot(0), "success")
    assert leader.tick(3600) == []


def test_one_read_finds_a_slot_behind_many_its_workers_recorded_first(store: RunStore) -> None:
    leader = _Watching(store)
    g = RunGuard(LedgerTarget(store, "beat", "w1", TTL, TTL / 3, 3600, 100), "rerun")
    leader.send(_slot(0))  # lost by the broker
    for n in range(1, 40):
        assert g.begin(_slot(n)).run  # started before the leader marked it sent
        leader.send(_slot(n))
    everything = dataclasses.replace(JOB, missed_slots="all")
    assert leader.tick(60, everything) == [_slot(0)], "found past the 39 newer records"


def test_a_slot_of_an_entry_gone_changed_or_expired_is_not_sent_again(store: RunStore) -> None:
    leader = _Watching(store)
    for n, job in enumerate(
        [
            None,  # removed, or paused
            dataclasses.replace(JOB, active_since=DUE + timedelta(minutes=5)),  # resumed since
            dataclasses.replace(JOB, generation="2"),  # made anew
        ]
    ):
        leader.send(_slot(n))
        assert leader.tick(60, job) == [], job
        assert record(store, _slot(n)).status == "sent"
    assert leader.tick(3600) == [], "each judged once"
    expiring = _Watching(store, expired=True)
    expiring.send(_slot(10))
    assert expiring.tick(60) == [], "its message expired: the entry's expires"


def test_the_workers_mark_lapses_a_few_ttl_after_the_last_worker(store: RunStore) -> None:
    marks.touch(store, "beat", WORKERS, {"worker": "w1"}, TTL)
    assert ledger_reads.record(store, WORKERS) is not None
    time.sleep(TTL + 0.05)
    assert ledger_reads.record(store, WORKERS) is None


def _worker(conf: dict[str, object]) -> SimpleNamespace:
    app = Celery(f"ledger-{uuid.uuid4().hex}", set_as_current=False)
    app.conf.update(conf)

    @app.task(name=f"ledger_unit.{app.main}")
    def noop() -> None:
        return None

    return SimpleNamespace(app=app, hostname="w1@test", task=lambda: app.tasks[noop.name])


def test_the_celery_step_is_on_by_default_where_the_settings_resolve() -> None:
    from celery_leader.celery import ledger as celery_ledger

    url = f"memory://ledger-{uuid.uuid4().hex}"
    on = _worker({"leader_url": url})
    celery_ledger._on_worker_init(sender=on)
    assert getattr(type(on.task()), "_celery_leader_ledger", False)
    store = open_store(LeaderConfig.from_mapping({"leader_url": url})).runs
    wait_for(lambda: ledger_reads.record(store, WORKERS) is not None, timeout=5)
    off = _worker({"leader_url": url, "leader_ledger": False})
    celery_ledger._on_worker_init(sender=off)
    assert not getattr(type(off.task()), "_celery_leader_ledger", False)
    # An app celery-leader cannot serve (no store) starts as before, unless it asked.
    amqp = {"broker_url": "amqp://guest@127.0.0.1:1//"}
    celery_ledger._on_worker_init(sender=_worker(amqp))
    with pytest.raises(SystemExit):
        celery_ledger._on_worker_init(sender=_worker({**amqp, "leader_ledger": True}))


def test_an_embedded_worker_logs_that_the_ledger_is_on_and_keeps_no_receiver(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker that is not ``celery worker``'s (``start_worker`` in a test suite, a
    ``WorkController`` of one's own) gets no ``celeryd_after_setup``: the line is
    logged at once, and no receiver waits for a signal that never comes (it
    would keep the worker alive as long as the process)."""
    from celery import signals

    from celery_leader.celery import ledger as celery_ledger

    before = len(signals.celeryd_after_setup.receivers)
    with caplog.at_level(logging.INFO, logger=celery_ledger.__name__):
        celery_ledger._on_worker_init(
            sender=_worker({"leader_url": f"memory://ledger-{uuid.uuid4().hex}"})
        )
    assert "celery-leader: run ledger on (" in caplog.text
    assert len(signals.celeryd_after_setup.receivers) == before


def test_pool_processes_count_into_one_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    shared = SharedCounters.create()
    monkeypatch.setenv(ENV_VAR, shared.path)  # undone after the test
    try:
        children = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:  # a pool process: its own descriptor, so the lock excludes
                mine = SharedCounters.from_env()
                code = 1
                if mine is not None:
                    for _ in range(300):
                        mine.add("ledger_runs", "beat")
                    mine.add("ledger_running", "beat", -1)
                    code = 0
                os._exit(code)
            children.append(pid)
        assert all(os.waitpid(pid, 0)[1] == 0 for pid in children)
        assert shared.read() == {("ledger_runs", "beat"): 900, ("ledger_running", "beat"): -3}
    finally:
        shared.remove()
    assert not os.path.exists(shared.path)


class _Captured(sentry_transport.Transport):
    """sentry_sdk's transport, kept in-process: the check-ins it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.check_ins: list[dict[str, object]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            if item.type == "check_in" and item.payload.json is not None:
                self.check_ins.append(item.payload.json)


@pytest.fixture
def sentry() -> Any:
    captured = _Captured()
    # No integrations: they would patch logging, threads and HTTP for the whole session.
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=captured,
        default_integrations=False,
        auto_enabling_integrations=False,
    )
    yield captured
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)


def test_sentry_crons_check_in_per_slot_that_runs(store: RunStore, sentry: _Captured) -> None:
    a = guard(store, "a")
    a.crons = SentryCrons()
    ok, bad = (f"Nightly Report@2026-01-01T0{i}:00:00.000+00:00" for i in range(2))
    assert a.begin(ok).run
    a.finish(ok, "success")
    assert a.begin(bad, overlap="skip").run
    assert not a.begin(bad).run  # a second delivery checks in nothing
    a.finish(bad, "failure")
    seen = [(c["monitor_slug"], c["status"]) for c in sentry.check_ins]
    assert seen == [("nightly-report", s) for s in ("in_progress", "ok", "in_progress", "error")]
    first, done = sentry.check_ins[:2]
    assert first["check_in_id"] == done["check_in_id"]
    assert isinstance(done["duration"], float) and done["duration"] >= 0
    # A slot skipped by the overlap guard runs nothing and checks in nothing.
    b = guard(store, "b")
    b.crons = SentryCrons()
    held = "nightly report@2026-01-01T03:00:00.000+00:00"
    assert a.begin(held, overlap="skip").run
    assert not b.begin("nightly report@2026-01-01T04:00:00.000+00:00", overlap="skip").run
    assert len(sentry.check_ins) == 5


def test_monitor_slugs() -> None:
    assert monitor_slug("db_tick every 5 s") == "db_tick-every-5-s"
    assert monitor_slug("x" * 80) == "x" * 50
    assert monitor_slug("§§") == "celery-leader"


def test_a_record_is_stored_compact_and_the_previous_form_still_reads() -> None:
    """A million records must fit a store: ~50 bytes a finished run, not ~220 (the JSON
    object of every field an earlier release wrote, which workers must still read)."""
    due = datetime.fromisoformat(SLOT.rpartition("@")[2]).timestamp()
    ran = RunRecord(SLOT, "started", "celery@worker-3", 4003, due + 0.25, due + 15.25)
    done = ran.ended(due + 1.05, "success")
    assert done.dump() == '["o","celery@worker-3",4003,0.25,15,1,0.8]'
    absolute = RunRecord.load('["o","w",1,1796412032.5,15]', SLOT)
    assert absolute is not None and absolute.started == 1796412032.5
    assert RunRecord.load(done.dump(), SLOT) == done
    skipped = ran.ended(due + 7, "skipped", "busy")
    assert RunRecord.load(skipped.dump(), SLOT) == skipped
    sent = RunRecord.sent_by(SLOT, "beat-1", 5, due - 0.003)
    assert RunRecord.load(sent.dump(), SLOT) == sent
    old = json.dumps(dataclasses.asdict(done), sort_keys=True, separators=(",", ":"))
    assert RunRecord.load(old, SLOT) == done
    assert RunRecord.load("[1,2]", SLOT) is None
    assert RunRecord.load('["?","w",1,2]', SLOT) is None


def test_a_record_keeps_the_epoch_its_slot_was_sent_under(store: RunStore) -> None:
    """Beat's sent mark and the worker's record carry the leader's epoch as the last
    field (a dozen bytes at most); a record without it, or with fields a later release
    adds after it, still reads."""
    due = datetime.fromisoformat(SLOT.rpartition("@")[2]).timestamp()
    sent = RunRecord.sent_by(SLOT, "beat-1", 5, due + 0.003, epoch=42)
    assert sent.dump() == '["s","beat-1",5,0.003,null,0,null,null,42]'
    assert RunRecord.load(sent.dump(), SLOT) == sent
    done = RunRecord(SLOT, "started", "w", 1, due + 0.25, due + 15.25, epoch=42).ended(
        due + 1.05, "success"
    )
    assert done.dump() == '["o","w",1,0.25,15,1,0.8,null,42]'
    loaded = RunRecord.load(done.dump(), SLOT)
    assert loaded is not None and loaded.epoch == 42
    without = RunRecord.load('["o","w",1,0.25,15,1,0.8]', SLOT)
    assert without is not None and without.epoch is None
    later = RunRecord.load('["o","w",1,0.25,15,1,0.8,null,42,"x",7]', SLOT)
    assert later == loaded
    assert RunRecord.load('["o","w",1,0.25,15,1,0.8,null,"7"]', SLOT).epoch is None  # type: ignore[union-attr]
    old = {"slot": SLOT, "status": "finished", "worker": "w", "pid": 1, "started": due,
           "alive_until": due, "attempt": 1, "finished": due + 1, "outcome": "success"}  # fmt: skip
    assert RunRecord.load(json.dumps(old), SLOT) == RunRecord(**old)  # type: ignore[arg-type]

    # The worker's record takes the epoch of the message; without one, the sent mark's.
    assert guard(store, "a").begin(SLOT, epoch=7).run
    assert record(store).epoch == 7
    other = SLOT.replace("00:00:00", "00:01:00")
    assert marks.mark_sent(store, "beat", other, "beat-1", 3600, 10, epoch=9)
    assert record(store, other).epoch == 9
    assert guard(store, "b").begin(other).run
    assert (record(store, other).status, record(store, other).epoch) == ("started", 9)
