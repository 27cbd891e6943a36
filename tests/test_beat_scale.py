"""A large schedule does not livelock a new term: 2 `celery beat` replicas with 100,000
daily entries and one every second, on a real Redis with the default tick timeout.

The leader starts dispatching the 1 s entry while it still loads the hourly ones, and
after a SIGKILL the standby does too. The bounds are generous: this is a livelock test
(before the due-time index nothing was ever sent at this size on a busy machine), not a
performance assertion; ``benchmarks/tick_cost.py`` measures.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import redis

from harness.procs import Proc, Procs
from harness.waiting import wait_for

pytestmark = pytest.mark.slow

CELERY = Path(sys.executable).with_name("celery")
REPO = Path(__file__).resolve().parents[1]
HOURLY = 100_000
#: Start (import, build 100,000 entries) to the first slot, and SIGKILL to the standby's.
FIRST_SLOT = 60.0
HAND_OVER = 20.0


def _slots(client: redis.Redis) -> list[tuple[str, int]]:
    """(leader_slot, publishing pid) of every message on the broker's queue, oldest first."""
    out = []
    for raw in reversed(client.lrange("celery", 0, -1)):
        headers = json.loads(raw)["headers"]
        pid = int(headers["origin"].partition("@")[0].removeprefix("gen"))
        out.append((headers["leader_slot"], pid))
    return out


def _ticks(client: redis.Redis) -> list[tuple[str, int]]:
    return [(slot, pid) for slot, pid in _slots(client) if slot.startswith("tick@")]


def test_a_100k_entry_schedule_dispatches_and_hands_over_after_a_sigkill(
    redis_url: str, procs: Procs, tmp_path: Path
) -> None:
    server = redis_url.rsplit("/", 1)[0]
    env = {
        "BROKER_URL": f"{server}/1",
        "LEADER_URL": f"{server}/0",
        "LEADER_TTL": "5",
        "BEAT_EVERY": "1",
        "BEAT_HOURLY": str(HOURLY),
        # Daily, not hourly: a test that runs across a full hour would send all of them.
        "BEAT_HOURLY_EVERY": "86400",
        "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)])),
    }
    beats: dict[int, Proc] = {}
    for n in range(2):
        proc = procs.spawn_python(
            CELERY,
            *["-A", "tests.apps.beat_app", "beat", "-S", "leader", "-l", "info"],
            env={**env, "INSTANCE_ID": f"beat-{n}"},
            cwd=tmp_path,
        )
        beats[proc.pid] = proc
    broker = redis.Redis.from_url(f"{server}/1")
    wait_for(lambda: _ticks(broker), FIRST_SLOT, 0.1, message="no slot of the 1 s entry was sent")
    leader = _ticks(broker)[0][1]
    assert leader in beats
    beats[leader].signal(signal.SIGKILL)
    killed = time.monotonic()
    standby = next(pid for pid in beats if pid != leader)
    wait_for(
        lambda: any(pid == standby for _, pid in _ticks(broker)),
        HAND_OVER,
        0.1,
        message="the standby sent no slot of the 1 s entry after the SIGKILL",
    )
    print(f"SIGKILL -> standby's first slot: {time.monotonic() - killed:.2f} s")
    slots = [slot for slot, _ in _slots(broker)]
    assert len(slots) == len(set(slots)), "a slot was sent twice"
    # The daily entries were anchored, not sent (none falls due at midnight UTC here).
    assert all(slot.startswith("tick@") for slot in slots) or time.gmtime().tm_hour == 0
