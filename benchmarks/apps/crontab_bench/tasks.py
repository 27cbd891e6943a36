"""The benchmark's entry for dramatiq-crontab: ``tick`` every PERIOD seconds."""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq_crontab import interval

dramatiq.set_broker(RedisBroker(url=os.environ["BROKER_URL"]))


@interval(seconds=float(os.environ.get("PERIOD", "0.2")))
@dramatiq.actor(queue_name="ticks")
def tick() -> None:
    """Never consumed: the benchmark takes the messages off the broker."""
