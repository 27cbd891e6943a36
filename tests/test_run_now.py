"""Run now through the leader, with real beats, Dramatiq schedulers and workers on Redis.

``leader entries run`` writes a request to the store and waits for the leader's
answer: the leader (never the CLI) sends the slot, once, under its epoch, with
the entry's options, so the overlap guard of the run ledger applies; the same
idempotency key runs once; with no leader the request waits for the next one.
The apps are the run ledger's test apps (``tests/apps/ledger_app.py``,
``tests/apps/ledger_dramatiq.py``): each run of a body is a line on the Redis
list ``runs``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis

from celery_leader.backends import open_store
from celery_leader.ledger import RunRecord
from celery_leader.settings.config import LeaderConfig
from harness.procs import Proc, Procs
from harness.waiting import wait_for
from tests.ledger_reads import record

ROOT = Path(__file__).resolve().parents[1]
CELERY = Path(sys.executable).parent / "celery"
DRAMATIQ = Path(sys.executable).parent / "dramatiq"
SCHEDULER = "import runpy; runpy.run_module('celery_leader.dramatiq', run_name='__main__')"
TTL = 2.0
#: The bodies of run-now slots sleep this long: the second request of the test is
#: made once the first body started, and reaches a worker within the leader's
#: entries poll (0.5 s), its tick (0.5 s at most) and a publish, a few seconds
#: under load; the first body must still run then.
BODY = 8.0
#: How long the CLI waits for the leader's answer: the poll and tick above, with
#: the slack of a loaded machine.
WAIT = 15.0
#: The period of the apps' scheduled entry: a year, so that no grid slot of it
#: falls due (and takes the overlap mark) while a test runs.
YEAR = str(365 * 24 * 3600)


def _runs(url: str) -> dict[str, int]:
    """Slot -> runs of its body."""
    counts: dict[str, int] = {}
    for line in redis.Redis.from_url(url, decode_responses=True).lrange("runs", 0, -1):
        run = json.loads(line)
        if "start" in run and run["slot"]:
            counts[run["slot"]] = counts.get(run["slot"], 0) + 1
    return counts


def _text(url: str, key: str) -> str | None:
    """The run ledger's record (or mark) ``key``."""
    store = open_store(LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL}))
    try:
        return record(store.runs, key)
    finally:
        store.close()


def _record(url: str, slot: str) -> RunRecord | None:
    text = _text(url, slot)
    return None if text is None else RunRecord.load(text, slot)


def _finished(url: str, slot: str) -> RunRecord | None:
    """``slot``'s run record once it says the slot ended (ran, failed or skipped)."""
    found = _record(url, slot)
    return found if found is not None and found.status == "finished" else None


def _leader(beats: list[Proc]) -> tuple[Proc, int]:
    """The beat (or scheduler) that leads, and its epoch, from its log."""
    pattern = re.compile(r"dispatching as leader of 'beat' \(epoch (\d+)\)")

    def found() -> tuple[Proc, int] | None:
        for beat in beats:
            if match := pattern.search(beat.output()):
                return beat, int(match[1])
        return None

    leader: tuple[Proc, int] = wait_for(found, 60, message="no replica led")
    return leader


class Cli:
    """``leader entries run`` of one app, as its users type it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = env

    def run(self, name: str, key: str, wait: float = WAIT) -> tuple[int, dict[str, Any]]:
        done = subprocess.run(
            [*self.argv, "run", name, "--key", key, "--wait", str(wait), "--json"],
            env={**os.environ, **self.env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode in (0, 3), (done.stdout, done.stderr)
        answer: dict[str, Any] = json.loads(done.stdout)
        return done.returncode, answer


def _celery(redis_url: str) -> tuple[dict[str, str], Cli]:
    env = {
        "BROKER_URL": redis_url,
        "LEADER_TTL": str(TTL),
        # A grid slot once a year: the slots of this test are the run-now ones.
        "BEAT_EVERY": YEAR,
        "WORK_SECONDS": str(BODY),
        "OVERLAP": "skip",
    }
    cli = Cli([str(CELERY), "-A", "tests.apps.ledger_app", "leader", "entries"], env)
    return env, cli


def _celery_beat(procs: Procs, env: dict[str, str]) -> Proc:
    return procs.spawn_python(
        CELERY,
        *("-A", "tests.apps.ledger_app", "beat", "-l", "INFO"),
        *("-S", "tests.apps.ledger_app:PausingScheduler"),
        env=env,
        cwd=ROOT,
    )


def _celery_worker(procs: Procs, env: dict[str, str], redis_url: str) -> Proc:
    worker = procs.spawn_python(
        CELERY,
        *("-A", "tests.apps.ledger_app", "worker", "-P", "prefork", "-c", "2", "-l", "INFO"),
        *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        env=env,
        cwd=ROOT,
    )
    worker.wait_for_line(r"ready\.", 60)
    wait_for(lambda: _text(redis_url, "@ledger-workers") is not None, 20,
             message="the worker registered in the ledger")  # fmt: skip
    return worker


def test_celery_run_now_is_sent_by_the_leader_once_under_its_epoch_with_the_overlap_guard(
    procs: Procs, redis_url: str
) -> None:
    env, cli = _celery(redis_url)
    _celery_worker(procs, env, redis_url)
    beats = [_celery_beat(procs, env) for _ in range(2)]
    leader, epoch = _leader(beats)

    code, first = cli.run("tick", "k1")
    assert code == 0 and first["state"] == "sent", first
    slot = first["slot"]
    assert slot.startswith("tick@run:") and first["epoch"] == epoch
    # The leader sent it, under its term; the follower and the CLI did not.
    sending = f"sending slot {slot} (epoch {epoch}): run-now request k1"
    wait_for(lambda: sending in leader.output(), 10, message="the leader logged the send")
    assert all(sending not in beat.output() for beat in beats if beat is not leader)
    wait_for(lambda: slot in _runs(redis_url), 30, message="the first run started")

    # Its body still runs: a second run of the entry is skipped by the overlap guard.
    code, second = cli.run("tick", "k2")
    assert code == 0 and second["state"] == "sent" and second["slot"] != slot, second
    skipped = wait_for(
        lambda: _finished(redis_url, second["slot"]), 30, message="the second run was recorded"
    )
    assert skipped.outcome == "skipped" and "still running" in (skipped.reason or "")

    # The same key again: the first request's answer; nothing is sent.
    code, again = cli.run("tick", "k1")
    assert (code, again["state"], again["slot"], again["repeated"]) == (0, "sent", slot, True)
    wait_for(lambda: _finished(redis_url, slot), 30, message="the first run finished")
    outputs = "".join(beat.output() for beat in beats)
    assert outputs.count("): run-now request ") == 2, "two requests, two slots sent"
    runs = {s: n for s, n in _runs(redis_url).items() if "@run:" in s}
    assert runs == {slot: 1}, "run once; the overlapping one skipped"


def test_celery_run_now_with_no_leader_waits_and_runs_after_the_election(
    procs: Procs, redis_url: str
) -> None:
    env, cli = _celery(redis_url)
    env["WORK_SECONDS"] = "0"
    _celery_worker(procs, env, redis_url)
    code, queued = cli.run("tick", "q", wait=1)
    assert (code, queued["state"], queued["slot"]) == (3, "queued", None)
    beat = _celery_beat(procs, env)
    _, epoch = _leader([beat])
    code, answered = cli.run("tick", "q")
    assert (code, answered["state"], answered["repeated"]) == (0, "sent", True), answered
    assert answered["epoch"] == epoch
    wait_for(lambda: _finished(redis_url, answered["slot"]), 30, message="the queued run ran")
    assert _runs(redis_url)[answered["slot"]] == 1


def test_dramatiq_run_now_is_sent_by_the_leader_once_under_its_epoch(
    procs: Procs, redis_url: str
) -> None:
    env = {
        "BROKER_URL": redis_url,
        "STORE_URL": redis_url,
        "CELERY_LEADER_LEDGER": "1",
        "CELERY_LEADER_TTL": str(TTL),
        "CELERY_LEADER_OVERLAP": "skip",
        "EVERY": YEAR,
        "TICK_SECONDS": str(BODY),
    }
    app = "tests.apps.ledger_dramatiq"
    worker = procs.spawn_python(DRAMATIQ, app, "-p", "1", "-t", "2", env=env, cwd=ROOT)
    worker.wait_for_line(r"Worker process is ready|is ready for action", 60)
    wait_for(lambda: _text(redis_url, "@ledger-workers") is not None, 20,
             message="the worker registered in the ledger")  # fmt: skip
    cli = Cli([sys.executable, "-m", "celery_leader", "entries", "--app", app], env)

    code, queued = cli.run("tick", "q", wait=1)
    assert (code, queued["state"]) == (3, "queued"), "no scheduler runs yet"
    schedulers = [procs.spawn_python(SCHEDULER, app, env=env, cwd=ROOT) for _ in range(2)]
    leader, epoch = _leader(schedulers)
    code, first = cli.run("tick", "q")
    assert (code, first["state"], first["epoch"], first["repeated"]) == (0, "sent", epoch, True)
    slot = first["slot"]
    assert f"sending slot {slot} (epoch {epoch}): run-now request q" in leader.output()
    wait_for(lambda: slot in _runs(redis_url), 30, message="the queued run started")

    code, second = cli.run("tick", "k2")
    assert code == 0 and second["state"] == "sent", second
    skipped = wait_for(
        lambda: _finished(redis_url, second["slot"]), 30, message="the second run was recorded"
    )
    assert skipped.outcome == "skipped" and "still running" in (skipped.reason or "")
    code, again = cli.run("tick", "k2")
    assert (again["slot"], again["repeated"]) == (second["slot"], True)
    wait_for(lambda: _finished(redis_url, slot), 30, message="the first run finished")
    runs = {s: n for s, n in _runs(redis_url).items() if "@run:" in s}
    assert runs == {slot: 1}
