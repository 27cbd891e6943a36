"""A Celery app for run-ledger tests: everything comes from environment variables.

BROKER_URL (Redis: broker, store and the record of runs), LEADER_TTL,
ON_REDELIVERY (``leader_on_redelivery``), LEDGER ("0" turns the ledger off, "1" on,
unset leaves the default),
METRICS_PORT (``leader_metrics_port``),
BEAT_EVERY (beat sends ``work`` as entry ``tick`` that often, for WORK_SECONDS,
with entry option ``overlap`` = OVERLAP), MISSED_SLOTS (``leader_missed_slots``),
and PAUSE_AT and LOSE_AT (see :class:`PausingScheduler`).
The ``work`` task sleeps ``seconds`` with ``acks_late`` and pushes one JSON
line per run of its body on the Redis list ``runs``: its slot, node, pid, and
wall-clock start and end (``end`` is pushed as a second line when it ends).
Redis redelivers an unacknowledged message after ``visibility_timeout`` (3 s),
looked for every second.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery import Celery, current_task

from celery_leader import LeaderScheduler

BROKER_URL = os.environ["BROKER_URL"]

app = Celery("ledger_app", broker=BROKER_URL)
app.conf.leader_url = BROKER_URL
app.conf.leader_ttl = float(os.environ.get("LEADER_TTL", "2"))
if "LEDGER" in os.environ:  # unset: the default (on)
    app.conf.leader_ledger = os.environ["LEDGER"] == "1"
app.conf.leader_on_redelivery = os.environ.get("ON_REDELIVERY", "rerun")
app.conf.leader_metrics_port = os.environ.get("METRICS_PORT")
if "MISSED_SLOTS" in os.environ:
    app.conf.leader_missed_slots = os.environ["MISSED_SLOTS"]
app.conf.worker_prefetch_multiplier = 1
app.conf.broker_connection_retry_on_startup = True
app.conf.broker_transport_options = {
    "visibility_timeout": 3,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}

_redis = redis.Redis.from_url(BROKER_URL, decode_responses=True)


def _slot() -> str | None:
    request = current_task.request
    return getattr(request, "leader_slot", None)


@app.task(acks_late=True)
def work(seconds: float = 0.0) -> None:
    """Record the run, sleep, record its end."""
    me = {"slot": _slot(), "node": current_task.request.hostname, "pid": os.getpid()}
    _redis.rpush("runs", json.dumps({**me, "start": time.time()}))
    time.sleep(seconds)
    _redis.rpush("runs", json.dumps({**me, "end": time.time()}))


if os.environ.get("BEAT_EVERY"):
    app.conf.beat_schedule = {
        "tick": {
            "task": "tests.apps.ledger_app.work",
            "schedule": float(os.environ["BEAT_EVERY"]),
            "args": [float(os.environ.get("WORK_SECONDS", "0"))],
            "options": {"overlap": os.environ["OVERLAP"]} if os.environ.get("OVERLAP") else {},
        }
    }


class PausingScheduler(LeaderScheduler):
    """Test-only faults: with PAUSE_AT=n, beat stops itself (SIGSTOP) right before
    it publishes its n-th slot, after claiming it: the window a crash can fall in.
    With LOSE_AT=n, its n-th publish goes nowhere and reports success: a message
    the broker lost after taking it."""

    published = 0

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        PausingScheduler.published += 1
        slot = entry.options["headers"]["leader_slot"]
        if PausingScheduler.published == int(os.environ.get("PAUSE_AT", "0")):
            print(f"pausing before publishing slot {slot}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if PausingScheduler.published == int(os.environ.get("LOSE_AT", "0")):
            print(f"losing slot {slot}", flush=True)
            return
        super().apply_entry(entry, producer=producer)
