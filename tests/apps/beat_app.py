"""A Celery app for beat tests: everything comes from environment variables.

BROKER_URL, LEADER_URL, LEADER_TTL, BEAT_EVERY (seconds between runs of the
``tick`` entry) and, optionally, BEAT_ENTRIES (how many such entries),
INSTANCE_ID (``leader_instance_id``), BEAT_HOURLY (that many hourly entries
more; BEAT_HOURLY_EVERY: their period) and BEAT_CRONTAB (the minute field of a
``crontab`` entry named ``cron``, e.g. ``*``; no such entry when unset).

Operations tests add: any ``CELERY_LEADER_*`` variable (the ``leader_*`` setting
of that name); BEAT_POLICIES (comma-separated ``leader_missed_slots`` values: one
entry ``tick-<policy>`` each, instead of ``tick``); HANG_FILE (an entry ``hang``
whose ``is_due`` blocks for 30 s, once, when ``<HANG_FILE>.<INSTANCE_ID>`` exists);
CLOCK_AHEAD (seconds this replica's wall clock runs ahead of the others');
HOOK_APPLY_ENTRY (patch ``Scheduler.apply_entry`` as sentry-sdk does, logging
``hook saw slot <leader_slot>`` for every call).

Run-ledger tests run workers of this app with RUNS_URL (a Redis): the ``noop``
task then exists, and pushes one JSON line per run of its body (its
``leader_slot`` and node) on the list ``runs`` there. Those workers consume a
queue of their own, ``workers``, bound like ``celery`` to the ``celery`` exchange;
beats with VIA_EXCHANGE=1 publish through that exchange (not straight to the
``celery`` queue), so the workers get a copy of every message while a test's tap
empties ``celery``.
"""

import logging
import os
import time
from datetime import datetime, timedelta, timezone

from celery import Celery
from celery.beat import Scheduler
from celery.schedules import crontab, schedule

from celery_leader.schedule import protocol

app = Celery("beat_app", broker=os.environ["BROKER_URL"])
app.conf.leader_url = os.environ.get("LEADER_URL")
app.conf.leader_ttl = float(os.environ.get("LEADER_TTL", "3"))
app.conf.leader_instance_id = os.environ.get("INSTANCE_ID")
for _name, _value in os.environ.items():
    if _name.startswith("CELERY_LEADER_"):
        app.conf[_name.removeprefix("CELERY_").lower()] = _value
EVERY = float(os.environ.get("BEAT_EVERY", "0.2"))
app.conf.beat_schedule = {
    f"tick{i}" if i else "tick": {"task": "beat_app.noop", "schedule": EVERY}
    for i in range(int(os.environ.get("BEAT_ENTRIES", "1")))
}
# BEAT_HOURLY: that many hourly interval entries more (a large schedule, mostly idle);
# BEAT_HOURLY_EVERY: their period instead of an hour.
app.conf.beat_schedule.update(
    {
        f"hourly{i}": {
            "task": "beat_app.noop",
            "schedule": float(os.environ.get("BEAT_HOURLY_EVERY", "3600")),
        }
        for i in range(int(os.environ.get("BEAT_HOURLY", "0")))
    }
)
if os.environ.get("BEAT_CRONTAB"):
    app.conf.beat_schedule["cron"] = {
        "task": "beat_app.cron",
        "schedule": crontab(minute=os.environ["BEAT_CRONTAB"]),
    }
if os.environ.get("BEAT_POLICIES"):
    app.conf.beat_schedule = {
        f"tick-{policy}": {
            "task": "beat_app.noop",
            "schedule": EVERY,
            "options": {"leader_missed_slots": policy},
        }
        for policy in os.environ["BEAT_POLICIES"].split(",")
    }


class HangingSchedule(schedule):  # type: ignore[misc]
    """An interval whose ``is_due`` blocks for 30 s once a trigger file names this replica."""

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        trigger = f"{os.environ['HANG_FILE']}.{os.environ.get('INSTANCE_ID')}"
        if os.path.exists(trigger):
            os.unlink(trigger)
            logging.getLogger("beat_app").warning("is_due hangs for 30 s")
            time.sleep(30)
        return super().is_due(last_run_at)  # type: ignore[no-any-return]


if os.environ.get("HANG_FILE"):
    app.conf.beat_schedule["hang"] = {"task": "beat_app.noop", "schedule": HangingSchedule(EVERY)}

if os.environ.get("CLOCK_AHEAD"):
    # The slot protocol's one wall clock (tests of whole clocks use harness.fakeclock).
    _ahead = timedelta(seconds=float(os.environ["CLOCK_AHEAD"]))
    protocol.utcnow = lambda: datetime.now(timezone.utc) + _ahead

if os.environ.get("HOOK_APPLY_ENTRY"):
    _original = Scheduler.apply_entry

    def _hooked(*args: object, **kwargs: object) -> object:
        entry = args[1]
        headers = entry.options.pop("headers", {})  # type: ignore[attr-defined]
        headers["hook-monitor-slug"] = entry.name  # type: ignore[attr-defined]
        entry.options["headers"] = headers  # type: ignore[attr-defined]
        logging.getLogger("beat_app").warning("hook saw slot %s", headers.get("leader_slot"))
        return _original(*args, **kwargs)

    Scheduler.apply_entry = _hooked  # type: ignore[method-assign]

if os.environ.get("VIA_EXCHANGE"):
    app.conf.task_routes = {"beat_app.noop": {"exchange": "celery", "routing_key": "celery"}}

if os.environ.get("RUNS_URL"):
    import json

    import redis
    from celery import current_task
    from kombu import Exchange, Queue

    _runs = redis.Redis.from_url(os.environ["RUNS_URL"])
    app.conf.task_queues = [Queue("workers", Exchange("celery"), routing_key="celery")]

    @app.task(name="beat_app.noop")  # type: ignore[misc]
    def noop() -> None:
        """Record this run of the body: its slot and node."""
        request = current_task.request
        run = {"slot": getattr(request, "leader_slot", None), "node": request.hostname}
        _runs.rpush("runs", json.dumps(run))
