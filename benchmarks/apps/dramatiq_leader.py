"""The benchmark's entry for celery-leader: ``tick`` every PERIOD seconds, scheduler embedded.

BROKER_URL, CELERY_LEADER_URL and CELERY_LEADER_TTL come from the environment.
"""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from celery_leader.dramatiq import LeaderMiddleware, every

broker = RedisBroker(url=os.environ["BROKER_URL"])
broker.add_middleware(LeaderMiddleware(scheduler=True))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="ticks", leader_schedule=every(float(os.environ.get("PERIOD", "0.2"))))
def tick() -> None:
    """Never consumed: the benchmark takes the messages off the broker."""
