"""Chaos: schedule entries edited through the CLI while three `celery beat` replicas run.

Three replicas of tests/apps/beat_app.py share a Redis broker and a lease store (Redis,
PostgreSQL, etcd). A script adds entries (every 1-3 s) with ``celery -A ... leader
entries add``, pauses some, resumes some, removes some, and SIGKILLs the leader twice
in between. The test
is the only consumer of the broker's queue (the tap of test_beat_chaos), so every
message there is a slot sent, with the time it arrived.

Checked: no ``leader_slot`` twice; every added entry's first slot within its period
+ 1 s of the add returning (an add made while a fail-over is under way: within the
fail-over bound + its period); no slot of a removed or paused entry arrives after the
edit returned + 1 s (until it is resumed); a resumed entry sends again, and nothing
due in the time it was paused.

Last, redbeat itself runs against a Redis, then celery-leader's beat on what
``import --from-redbeat`` made of redbeat's entry: both send as many slots.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis as redis_lib
from celery import Celery
from celery.schedules import schedule
from redbeat import RedBeatSchedulerEntry

from celery_leader.settings.config import LeaderConfig
from harness.fleet import parse_slot
from harness.procs import Procs
from harness.procs import signal as send_signal
from harness.procs import start as start_proc
from harness.servers import RedisServer
from harness.waiting import wait_for
from tests import test_beat_chaos as beat_chaos
from tests import test_dramatiq_chaos as dramatiq_chaos
from tests.test_beat_chaos import (
    BEAT,
    CELERY,
    FAILOVER,
    PYTHONPATH,
    REPO,
    Broker,
    BrokerTap,
    Holder,
    Replicas,
    beat_env,
)

# The fixtures of the beat chaos tests, registered here under their own names
# (pytest finds a fixture by the module attribute's name).
for _fixture in ("beat_holder", "broker", "lease_store", "tap"):
    globals()[_fixture] = getattr(beat_chaos, _fixture)

pytestmark = [pytest.mark.slow, pytest.mark.paced]

APP = ["-A", "tests.apps.beat_app"]
#: Slack on top of "within its period of the add" / "nothing after the edit".
SLACK = 1.0


@dataclass
class Edits:
    """What the script did, with the monotonic time each CLI call returned."""

    env: dict[str, str]
    #: The entries command up to its subcommand (``celery -A app leader entries``).
    command: list[str]
    added: dict[str, tuple[float, float, datetime]] = field(default_factory=dict)
    paused: dict[str, float] = field(default_factory=dict)
    paused_at: dict[str, datetime] = field(default_factory=dict)
    resumed: dict[str, tuple[float, datetime]] = field(default_factory=dict)
    removed: dict[str, float] = field(default_factory=dict)
    kills: list[float] = field(default_factory=list)

    def cli(self, *args: str) -> float:
        """Run one entries command; return when it returned (monotonic)."""
        done = subprocess.run(
            [*self.command, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert done.returncode == 0, f"{args}: {done.stderr}"
        return time.monotonic()


@pytest.mark.parametrize(
    "kind", ["redis", pytest.param("postgres", marks=pytest.mark.postgres), "etcd"]
)
def test_entries_edited_from_the_cli_while_the_leader_is_killed(
    kind: str,
    request: pytest.FixtureRequest,
    procs: Procs,
    broker: Broker,
    tap: BrokerTap,
    beat_holder: Callable[[str], Holder],
    tmp_path: Path,
) -> None:
    env = beat_env(broker.url)
    env["BEAT_EVERY"] = "5"  # the code entry: a little noise, not the subject
    if kind == "redis":
        url = request.getfixturevalue("lease_store").url
    else:
        url = request.getfixturevalue(f"{kind}_url")
    beats = Replicas(procs, tmp_path, BEAT, env, [url] * 3, beat_holder(url))
    beats.start()
    cli_env = {
        **os.environ,
        **env,
        "LEADER_URL": url,
        "PYTHONPATH": os.pathsep.join(filter(None, [PYTHONPATH, str(REPO)])),
    }
    edits = Edits(cli_env, [str(CELERY), *APP, "leader", "entries"])
    periods = periods_of(20)

    def kill_leader() -> None:
        place, proc, _ = beats.leader()
        send_signal(proc, signal.SIGKILL)
        edits.kills.append(time.monotonic())
        beats.replace(place)

    script(edits, periods, "beat_app.noop", kill_leader, kill_after_adds=(7, 14), kill_at_rm=3)

    def arrivals() -> list[tuple[float, str]]:
        return [(p.seen, p.slot) for p in tap.published() if p.slot and p.slot[:1] == "e"]

    check(edits, periods, arrivals)
    beats_alive = [p for p in beats.current if p.alive]
    assert len(beats_alive) == 3


def periods_of(count: int) -> dict[str, int]:
    """Entry name -> period (1, 2 or 3 s), the same on every run."""
    rng = random.Random(29)
    return {f"e{i:02d}": rng.choice((1, 2, 3)) for i in range(count)}


def script(
    edits: Edits,
    periods: dict[str, int],
    task: str,
    kill_leader: Callable[[], None],
    kill_after_adds: tuple[int, ...],
    kill_at_rm: int,
) -> None:
    """Add every entry, pause the first 30 %, resume half of those, remove 40 % from the
    middle, killing the leader after the adds numbered ``kill_after_adds`` and at the
    ``kill_at_rm``-th removal."""
    names = list(periods)
    n = len(names)
    for i, name in enumerate(names):
        wall = datetime.now(timezone.utc)
        start = time.monotonic()
        done = edits.cli("add", name, "--task", task, "--every", str(periods[name]))
        edits.added[name] = (start, done, wall)
        if i in kill_after_adds:
            kill_leader()
    paused = names[: max(1, n * 3 // 10)]
    for name in paused:
        edits.paused[name] = edits.cli("pause", name)
        edits.paused_at[name] = datetime.now(timezone.utc)
    for name in paused[: max(1, len(paused) // 2)]:
        time.sleep(1)  # a pause long enough to have slots due in it
        # The edit lands while the command runs: the pause ends at its start.
        start, wall = time.monotonic(), datetime.now(timezone.utc)
        edits.cli("resume", name)
        edits.resumed[name] = (start, wall)
    for i, name in enumerate(names[n // 2 : n // 2 + max(1, n * 4 // 10)]):
        edits.removed[name] = edits.cli("rm", name)
        if i == kill_at_rm:
            kill_leader()


def check(
    edits: Edits,
    periods: dict[str, int],
    arrivals: Callable[[], list[tuple[float, str]]],
    failover: float = FAILOVER,
) -> None:
    """Wait until the resumed entries send again, then check every rule (see the module
    docstring) on the slots that arrived: ``(monotonic time, leader_slot)``."""
    settle = time.monotonic()
    wait_for(
        lambda: all(
            any(s.startswith(f"{n}@") and seen > edits.resumed[n][0] for seen, s in arrivals())
            for n in edits.resumed
        ),
        failover + 10,
        interval=0.1,
        message="a resumed entry did not send again",
    )
    time.sleep(max(periods.values()) + SLACK)  # every live entry sends once more
    published = arrivals()
    problems = []
    twice = [s for s, n in Counter(s for _, s in published).items() if n > 1]
    if twice:
        problems.append(f"slots sent twice: {twice}")
    by_entry: dict[str, list[tuple[float, datetime, str]]] = {}
    for seen, slot in published:
        if "@run:" not in slot:
            entry, due = parse_slot(slot)
            by_entry.setdefault(entry, []).append((seen, due, slot))
    for name, (_, done, _) in edits.added.items():
        sent = sorted(by_entry.get(name, []))
        if not sent:
            problems.append(f"{name}: never sent")
            continue
        bound = periods[name] + SLACK
        if any(0 <= done - k <= failover for k in edits.kills) or any(
            0 <= k - done <= bound for k in edits.kills
        ):
            bound += failover  # added around a SIGKILL: the fail-over comes first
        if sent[0][0] - done > bound:
            problems.append(f"{name}: first slot {sent[0][0] - done:.2f} s after the add")
    for name, done in edits.removed.items():
        late = [s for seen, _, s in by_entry.get(name, []) if seen > done + SLACK]
        if late:
            problems.append(f"{name}: sent after rm: {late}")
    for name, done in edits.paused.items():
        until = edits.resumed[name][0] if name in edits.resumed else float("inf")
        late = [
            f"{s} at {seen - done:+.2f} s"
            for seen, _, s in by_entry.get(name, [])
            if done + SLACK < seen < until
        ]
        if late:
            problems.append(f"{name}: sent while paused (resumed at {until - done:+.2f}): {late}")
    for name, (_, resumed_wall) in edits.resumed.items():
        paused_wall = edits.paused_at[name]
        in_pause = [
            s
            for _, due, s in by_entry.get(name, [])
            if paused_wall.timestamp() + SLACK < due.timestamp() < resumed_wall.timestamp()
        ]
        if in_pause:
            problems.append(f"{name}: resumed, but sent slots due while paused: {in_pause}")
    first = min(start for start, _, _ in edits.added.values())
    print(
        f"\n{len(published)} slots of {len(edits.added)} entries; "
        f"kills at {[round(k - first, 1) for k in edits.kills]} s; settled in "
        f"{time.monotonic() - settle:.1f} s"
    )
    assert not problems, "\n".join(problems)


def test_entries_edited_from_the_cli_with_two_standalone_dramatiq_schedulers(
    procs: Procs, redis_url: str
) -> None:
    """The same script on Dramatiq: ``python -m celery_leader entries --app MODULE``, two
    standalone schedulers (tests/apps/dramatiq_app.py) on Redis, the leader killed twice."""
    with RedisServer() as broker_server:
        tap = dramatiq_chaos.Tap(broker_server.client())
        env = {"BROKER_URL": broker_server.url, "LEADER_URL": redis_url, "LEADER_TTL": "3"}
        env["EVERY"] = "5"  # the code entry: a little noise, not the subject
        replicas = dramatiq_chaos.Replicas(procs, env, embedded=False)
        replicas.places = [replicas.spawn() for _ in range(2)]
        config = LeaderConfig.from_env(environ={}, leader_url=redis_url, leader_ttl=3.0)
        command = [sys.executable, "-m", "celery_leader", "entries", "--app", dramatiq_chaos.APP]
        edits = Edits({**os.environ, **replicas.env}, command)
        periods = periods_of(10)

        def kill_leader() -> None:
            pid = dramatiq_chaos.leader_pid(config, FAILOVER + 5)
            replica = dramatiq_chaos.replica_of(replicas, pid)
            replica.signal(signal.SIGKILL)
            edits.kills.append(time.monotonic())
            replicas.replace(replica)

        script(edits, periods, "tick", kill_leader, kill_after_adds=(4,), kill_at_rm=1)

        def arrivals() -> list[tuple[float, str]]:
            return [(s.seen, s.slot) for s in tap.sent() if s.slot[:1] == "e"]

        try:
            check(edits, periods, arrivals)
        finally:
            tap.close()


RB_BEAT_APP = """
from celery import Celery
app = Celery("rb_beat", broker="{url}")
app.conf.timezone = "UTC"
app.conf.leader_url = "{url}"
app.conf.redbeat_redis_url = "{url}"

@app.task
def tick():
    pass
"""


def test_redbeat_and_its_imported_entry_send_as_many_slots(redis_url: str, tmp_path: Path) -> None:
    """redbeat for real, then celery-leader on what ``import --from-redbeat`` made of
    its entry: each ``celery beat`` runs alone against the same Redis, and the test
    (the queue's only consumer) counts the sends in the same 11 s after each one's
    first send. An every-2-s entry: 5 sends each (redbeat counts from its last
    run, celery-leader on the grid, so the times differ by a phase, not the count)."""
    (tmp_path / "rb_beat.py").write_text(RB_BEAT_APP.format(url=redis_url))
    app = Celery("rb_beat", broker=redis_url, set_as_current=False)
    app.conf.redbeat_redis_url = redis_url
    every = schedule(timedelta(seconds=2), app=app)
    RedBeatSchedulerEntry("every-2", "rb_beat.tick", every, app=app).save()
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{PYTHONPATH}"}
    tap = BrokerTap(redis_lib.Redis.from_url(redis_url))
    window = 11.0
    source = ["--from-redbeat", redis_url]
    counts = {}
    try:
        for scheduler in ("redbeat.RedBeatScheduler", "leader"):
            if scheduler == "leader":
                done = subprocess.run(
                    [str(CELERY), "-A", "rb_beat", "leader", "entries", "import", *source],
                    cwd=tmp_path,
                    env={**os.environ, **env},
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert done.returncode == 0, done.stderr
            before = len(tap.published())
            log = tmp_path / f"{scheduler}.log"
            beat = start_proc(
                [str(CELERY), "-A", "rb_beat", "beat", "-S", scheduler, "-l", "INFO"],
                env=env,
                cwd=tmp_path,
                log_path=log,
            )
            try:
                first = wait_for(
                    lambda before=before: tap.published()[before:],
                    timeout=30,
                    message=lambda log=log: log.read_text()[-2000:],
                )[0].seen
                wait_for(lambda first=first: time.monotonic() > first + window + 0.5, 20)
            finally:
                beat.kill_group()
            sent = [p for p in tap.published()[before:] if first < p.seen <= first + window]
            counts[scheduler] = len(sent)
            if scheduler == "leader":
                assert all(p.slot and p.slot.startswith("every-2@") for p in sent)
    finally:
        tap.close()
    assert counts == {"redbeat.RedBeatScheduler": 5, "leader": 5}, counts
