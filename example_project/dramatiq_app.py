"""A Dramatiq app with one scheduler across replicas: run it on every replica.

    CELERY_LEADER_URL=redis://127.0.0.1:6379/1 dramatiq dramatiq_app -p 2

Settings come from the environment: DEMO_BROKER_URL (the Redis broker),
CELERY_LEADER_URL and CELERY_LEADER_TTL (the lease), DEMO_EVERY (seconds between
``tick`` slots) and DEMO_LEDGER (a file where ``tick`` notes each slot it ran).
``bash scripts/quickstart.sh --dramatiq`` runs three replicas of it and kills the
leader twice (example_project/dramatiq_quickstart.py).
"""

from __future__ import annotations

import json
import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

from celery_leader.dramatiq import LeaderMiddleware, cron, current_epoch, every

broker = RedisBroker(url=os.environ.get("DEMO_BROKER_URL", "redis://127.0.0.1:6379/0"))
broker.add_middleware(CurrentMessage())
# url, ttl, ... from CELERY_LEADER_*; the scheduler runs in a fork of `dramatiq`.
broker.add_middleware(LeaderMiddleware(scheduler=True))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="ticks", leader_schedule=every(float(os.environ.get("DEMO_EVERY", "1"))))
def tick() -> None:
    """Note the slot this message fulfils, the term it was sent under and who ran it."""
    message = CurrentMessage.get_current_message()
    assert message is not None
    line = json.dumps(
        {
            "slot": message.options["leader_slot"],
            "epoch": message.options["leader_epoch"],
            "message_id": message.message_id,
            "pid": os.getpid(),
        }
    )
    ledger = os.environ.get("DEMO_LEDGER")
    if ledger:
        # One short O_APPEND write per line: lines from several processes never interleave.
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


@dramatiq.actor(leader_schedule=cron("30 2 * * *", tz="Europe/Berlin"))
def nightly() -> None:
    """Once a night at 02:30 Berlin time, on one replica (once, too, when clocks change)."""


@dramatiq.actor(queue_name="reports", leader_only=True)  # waits: the default
def rebuild_report() -> None:
    """Only the process leading the worker election consumes the ``reports`` queue."""
    dramatiq.get_logger(__name__).info("rebuilding the report under epoch %s", current_epoch())
