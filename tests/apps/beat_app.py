"""A Celery app for beat tests: everything comes from environment variables.

BROKER_URL, LEADER_URL, LEADER_TTL, BEAT_EVERY (seconds between runs of the
``tick`` entry) and, optionally, BEAT_ENTRIES (how many such entries).
"""

import os

from celery import Celery

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
