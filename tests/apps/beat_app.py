"""A Celery app for beat tests: everything comes from environment variables.

BROKER_URL, LEADER_URL, LEADER_TTL, BEAT_EVERY (seconds between runs of the
``tick`` entry) and, optionally, BEAT_ENTRIES (how many such entries),
INSTANCE_ID (``leader_instance_id``) and BEAT_CRONTAB (the minute field of a
``crontab`` entry named ``cron``, e.g. ``*``; no such entry when unset).
"""

import os

from celery import Celery
from celery.schedules import crontab

app = Celery("beat_app", broker=os.environ["BROKER_URL"])
app.conf.leader_url = os.environ.get("LEADER_URL")
app.conf.leader_ttl = float(os.environ.get("LEADER_TTL", "3"))
app.conf.leader_instance_id = os.environ.get("INSTANCE_ID")
app.conf.beat_schedule = {
    f"tick{i}" if i else "tick": {
        "task": "beat_app.noop",
        "schedule": float(os.environ.get("BEAT_EVERY", "0.2")),
    }
    for i in range(int(os.environ.get("BEAT_ENTRIES", "1")))
}
if os.environ.get("BEAT_CRONTAB"):
    app.conf.beat_schedule["cron"] = {
        "task": "beat_app.cron",
        "schedule": crontab(minute=os.environ["BEAT_CRONTAB"]),
    }
