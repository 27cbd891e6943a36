"""The scale benchmark's Celery app: many hourly entries and one every second.

Configured by environment:

BROKER_URL      where tasks are published (read back by the benchmark)
LEADER_URL      celery-leader's store (``LeaderScheduler``)
REDBEAT_URL     redbeat's Redis (``SlotRedBeatScheduler``)
LEADER_TTL      lease ttl, also redbeat's lock timeout
SCALE_CODE_N    how many hourly code entries (``hourly<i>``); 0 when they live in the store
SCALE_MINUTE    the minute of the hour they are due at, chosen by the benchmark to
                fall outside the run, so that no burst of them disturbs it

The ``tick`` entry, due every second, is always a code entry.
"""

import os

from celery import Celery
from celery.schedules import crontab

TICK, HOURLY = "scale.tick", "scale.hourly"

app = Celery("scale_app", broker=os.environ["BROKER_URL"])
app.conf.leader_url = os.environ.get("LEADER_URL")
app.conf.leader_ttl = float(os.environ.get("LEADER_TTL", "5"))
app.conf.redbeat_redis_url = os.environ.get("REDBEAT_URL")
app.conf.redbeat_lock_timeout = app.conf.leader_ttl
if app.conf.redbeat_redis_url:
    # redbeat's standbys retry its lock once per loop interval (default 300 s):
    # tuned to 1 s, as the fail-over benchmark does, so its hand-over is measured
    # at its best.
    app.conf.beat_max_loop_interval = 1

_hourly = crontab(minute=os.environ.get("SCALE_MINUTE", "0"))
app.conf.beat_schedule = {
    "tick": {"task": TICK, "schedule": 1.0},
    **{
        f"hourly{i}": {"task": HOURLY, "schedule": _hourly}
        for i in range(int(os.environ.get("SCALE_CODE_N", "0")))
    },
}
