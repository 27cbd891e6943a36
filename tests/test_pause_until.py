"""A pause with an end, for real: a ``celery beat`` replica (tests/apps/beat_app.py), or a
standalone Dramatiq scheduler (tests/apps/dramatiq_app.py), on a Redis broker and a
Redis lease store; ``entries pause NAME --until`` a few seconds ahead, from the real
command line, of a store entry and of a code entry, both every second. The test reads
every slot sent off the broker (the taps of test_beat_chaos and test_dramatiq_chaos),
with the time it arrived.

Checked: nothing arrives while paused (after the pause returned + 1 s), no slot due
inside the pause is ever sent, and each entry sends again by itself from the pause's
end, its first slot the one due exactly then, with no edit in between.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from harness.fleet import parse_slot
from harness.procs import Procs
from harness.servers import RedisServer
from harness.waiting import wait_for
from tests import test_beat_chaos as beat_chaos
from tests import test_dramatiq_chaos as dramatiq_chaos
from tests.test_beat_chaos import (
    BEAT,
    CELERY,
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

pytestmark = [pytest.mark.paced]

#: How far ahead the pause ends, at least: the two pause commands run at once and
#: take about as long as the ``add`` before them (a CLI start, about 1 s idle); the
#: pause is made longer when that ``add`` was slow (see :func:`pause_length`), so
#: that at least 2 s of it, two 1 s slots, are left once both commands returned.
PAUSE = 8.0
#: Seconds of the pause left, at least, when both pause commands have returned.
LEFT = 2.0
#: An edit reaches the leader within its 0.5 s poll of the entries version; one
#: more tick and a publish fit in the rest of the second.
SLACK = 1.0


def test_entries_paused_until_a_time_send_nothing_until_then_and_again_after(
    procs: Procs,
    broker: Broker,
    tap: BrokerTap,
    lease_store: RedisServer,
    beat_holder: Callable[[str], Holder],
    tmp_path: Path,
) -> None:
    env = beat_env(broker.url)
    env["BEAT_EVERY"] = "1"  # the code entry ``tick``
    url = lease_store.url
    beats = Replicas(procs, tmp_path, BEAT, env, [url], beat_holder(url))
    beats.start()
    cli_env = {
        **os.environ,
        **env,
        "LEADER_URL": url,
        "PYTHONPATH": os.pathsep.join(filter(None, [PYTHONPATH, str(REPO)])),
    }
    command = [str(CELERY), "-A", "tests.apps.beat_app", "leader", "entries"]

    def arrivals() -> list[tuple[float, str]]:
        return [(p.seen, p.slot) for p in tap.published() if p.slot]

    check_pause_until(command, cli_env, "beat_app.noop", arrivals)


def test_the_dramatiq_scheduler_honours_a_pause_until_a_time(
    procs: Procs, redis_url: str
) -> None:
    with RedisServer() as broker_server:
        tap = dramatiq_chaos.Tap(broker_server.client())
        env = {"BROKER_URL": broker_server.url, "LEADER_URL": redis_url, "EVERY": "1"}
        replicas = dramatiq_chaos.Replicas(procs, env, embedded=False)
        replicas.places = [replicas.spawn()]
        command = [sys.executable, "-m", "celery_leader", "entries", "--app", dramatiq_chaos.APP]

        def arrivals() -> list[tuple[float, str]]:
            return [(s.seen, s.slot) for s in tap.sent()]

        try:
            check_pause_until(command, {**os.environ, **replicas.env}, "tick", arrivals)
        finally:
            tap.close()


def check_pause_until(
    command: list[str],
    env: dict[str, str],
    task: str,
    arrivals: Callable[[], list[tuple[float, str]]],
) -> None:
    """Add the store entry ``st`` (every second, sending ``task``) beside the code
    entry ``tick``, pause both until a few seconds ahead, check (see the module
    docstring) on ``arrivals``: (monotonic time, ``leader_slot``) of each slot."""

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*command, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )

    def finish(*runs: subprocess.Popen[str]) -> None:
        for run in runs:
            _, stderr = run.communicate(timeout=60)
            assert run.returncode == 0, f"{run.args}: {stderr}"

    def sent(entry: str) -> list[tuple[float, datetime]]:
        """(arrival, due) of each slot of ``entry`` that arrived."""
        return [(seen, parse_slot(s)[1]) for seen, s in arrivals() if s.startswith(f"{entry}@")]

    began = time.monotonic()
    finish(start("add", "st", "--task", task, "--every", "1"))
    length = pause_length(time.monotonic() - began)
    wait_for(lambda: sent("st") and sent("tick"), 15, message="the entries never sent")
    # A whole second, on both entries' grid, at least ``length`` ahead.
    ahead = timedelta(seconds=math.ceil(length) + 1)
    until = datetime.now(timezone.utc).replace(microsecond=0) + ahead
    pause = ("--reason", "maintenance", "--until", until.isoformat())
    finish(*[start("pause", entry, *pause) for entry in ("st", "tick")])
    paused = time.monotonic()
    paused_wall = datetime.now(timezone.utc)
    left = (until - paused_wall).total_seconds()
    assert left > LEFT, f"the pause must span slots: {left:.1f} s of {length:.1f} s left"

    def again() -> bool:
        return all(any(due >= until for _, due in sent(e)) for e in ("st", "tick"))

    wait_for(again, left + 15, interval=0.1, message="a paused entry never sent again")
    ends = paused + (until - paused_wall).total_seconds()  # the pause's end, monotonic
    problems = []
    for entry in ("st", "tick"):
        slots = sent(entry)
        during = [(seen - paused, due) for seen, due in slots if paused + SLACK < seen < ends]
        if during:
            problems.append(f"{entry}: arrived while paused (s after the pause, due): {during}")
        inside = [due for _, due in slots if paused_wall + timedelta(seconds=SLACK) < due < until]
        if inside:
            problems.append(f"{entry}: slots due inside the pause were sent: {inside}")
        after = sorted(due for _, due in slots if due >= until)
        if after[0] != until:
            problems.append(f"{entry}: first slot after the pause {after[0]}, not {until}")
    assert not problems, "\n".join(problems)


def pause_length(add: float) -> float:
    """How far ahead the pause ends, given how long the ``add`` command took: the two
    pause commands after it run at once on two cores, each about as long as it; twice
    that, and :data:`LEFT`, leave room for a machine that got busier meanwhile."""
    return max(PAUSE, 2 * add + LEFT)
