"""A Celery app for the fake-clock tests (tests/test_fake_clock.py): DST-sensitive entries.

``timezone = "Europe/Berlin"``; for each policy in CLOCK_POLICIES (comma-separated
``leader_missed_slots`` values, default ``once``) three entries, suffixed with the
policy: ``fixed230-<policy>`` (crontab 02:30), ``q15-<policy>`` (crontab every 15
minutes) and ``min-<policy>`` (every 60 s). BROKER_URL, LEADER_URL, LEADER_TTL and
INSTANCE_ID as in beat_app; CLOCK_CRONTAB_DST sets ``leader_crontab_dst`` and
CELERY_LEADER_CLOCK ``leader_clock`` (CELERY_LEADER_MAX_CLOCK_SKEW its bound).
CLOCK_EVERY5=1 adds ``five`` (every 5 s).

Beat loops at least every 0.05 s: its sleeps are real seconds while the clock runs
fast, and a long sleep would skip fake minutes.
"""

import os

from celery import Celery
from celery.schedules import crontab

app = Celery("clock_app", broker=os.environ["BROKER_URL"])
app.conf.timezone = "Europe/Berlin"
app.conf.beat_max_loop_interval = 0.05
app.conf.leader_url = os.environ.get("LEADER_URL")
app.conf.leader_ttl = float(os.environ.get("LEADER_TTL", "3"))
app.conf.leader_instance_id = os.environ.get("INSTANCE_ID")
app.conf.leader_clock = os.environ.get("CELERY_LEADER_CLOCK")
app.conf.leader_max_clock_skew = os.environ.get("CELERY_LEADER_MAX_CLOCK_SKEW")
if os.environ.get("CLOCK_CRONTAB_DST"):
    app.conf.leader_crontab_dst = os.environ["CLOCK_CRONTAB_DST"]
app.conf.beat_schedule = {}
for _policy in os.environ.get("CLOCK_POLICIES", "once").split(","):
    _options = {"leader_missed_slots": _policy}
    app.conf.beat_schedule.update(
        {
            f"fixed230-{_policy}": {
                "task": "clock_app.run",
                "schedule": crontab(hour=2, minute=30),
                "options": _options,
            },
            f"q15-{_policy}": {
                "task": "clock_app.run",
                "schedule": crontab(minute="*/15"),
                "options": _options,
            },
            f"min-{_policy}": {"task": "clock_app.run", "schedule": 60.0, "options": _options},
        }
    )
if os.environ.get("CLOCK_EVERY5"):
    app.conf.beat_schedule["five"] = {"task": "clock_app.run", "schedule": 5.0}
