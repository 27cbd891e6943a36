"""A Dramatiq app for run-ledger tests: BROKER_URL (Redis: broker, store and the
record of runs) and the ``CELERY_LEADER_*`` environment (``CELERY_LEADER_LEDGER=1``).

The ``work`` actor pushes one JSON line per run of its body on the Redis list
``runs``: its ``leader_slot`` and pid.
"""

import json
import os
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

from celery_leader.dramatiq import LeaderMiddleware

broker = RedisBroker(url=os.environ["BROKER_URL"])
broker.add_middleware(CurrentMessage())
broker.add_middleware(LeaderMiddleware(url=os.environ["BROKER_URL"]))
dramatiq.set_broker(broker)

_redis = redis.Redis.from_url(os.environ["BROKER_URL"], decode_responses=True)


@dramatiq.actor(max_retries=0)
def work(seconds: float = 0.0) -> None:
    """Record the run and sleep."""
    message = CurrentMessage.get_current_message()
    slot = None if message is None else message.options.get("leader_slot")
    _redis.rpush("runs", json.dumps({"slot": slot, "pid": os.getpid(), "start": time.time()}))
    time.sleep(seconds)
