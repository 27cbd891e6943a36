"""A Dramatiq app for the fake-clock tests: the entries of clock_app, as cron() and every().

For each policy in CLOCK_POLICIES (default ``once``): ``fixed230-<policy>``
(``cron("30 2 * * *", tz="Europe/Berlin")``), ``q15-<policy>``
(``cron("*/15 * * * *", tz="Europe/Berlin")``) and ``min-<policy>`` (``every(60)``).
BROKER_URL (Redis), LEADER_URL and LEADER_TTL as in dramatiq_app (the middleware
reads CELERY_LEADER_CLOCK itself); CLOCK_EVERY5=1 adds ``five`` (``every(5)``). The ``ticks``
queue is consumed by nobody: the tests read the sent slots from the broker.
"""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from celery_leader.dramatiq import LeaderMiddleware, cron, every

broker = RedisBroker(url=os.environ["BROKER_URL"])
broker.add_middleware(
    LeaderMiddleware(url=os.environ["LEADER_URL"], ttl=float(os.environ.get("LEADER_TTL", "3")))
)
dramatiq.set_broker(broker)

_schedules = []
for _policy in os.environ.get("CLOCK_POLICIES", "once").split(","):
    _schedules += [
        cron("30 2 * * *", tz="Europe/Berlin", name=f"fixed230-{_policy}", missed_slots=_policy),
        cron("*/15 * * * *", tz="Europe/Berlin", name=f"q15-{_policy}", missed_slots=_policy),
        every(60, name=f"min-{_policy}", missed_slots=_policy),
    ]


if os.environ.get("CLOCK_EVERY5"):
    _schedules.append(every(5, name="five"))


@dramatiq.actor(queue_name="ticks", leader_schedule=_schedules)
def run() -> None:
    """Sent by the scheduler; never consumed."""
