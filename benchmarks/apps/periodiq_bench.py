"""The benchmark's entry for periodiq: ``tick`` every minute (its finest grain)."""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from periodiq import PeriodiqMiddleware, cron

broker = RedisBroker(url=os.environ["BROKER_URL"])
broker.add_middleware(PeriodiqMiddleware(skip_delay=30))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="ticks", periodic=cron("* * * * *"))
def tick() -> None:
    """Never consumed: the benchmark takes the messages off the broker."""
