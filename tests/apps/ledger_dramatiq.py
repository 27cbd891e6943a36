"""A Dramatiq app for run-ledger tests: BROKER_URL (Redis or RabbitMQ), STORE_URL
(a Redis: the lease store and the record of runs; BROKER_URL when unset) and the
``CELERY_LEADER_*`` environment (``CELERY_LEADER_LEDGER=1``).

The ``work`` actor pushes one JSON line per run of its body on the Redis list
``runs``: its ``leader_slot`` and pid. With EVERY set, the scheduled actor ``tick``
does the same every EVERY seconds, its body lasting TICK_SECONDS (default 0).
PAUSE_AT=n is a test-only fault: the scheduler stops itself (SIGSTOP) right
before it enqueues its n-th slot, after claiming it. With LOSE_AT=n its n-th
enqueue goes nowhere and reports success: a message the broker lost.
"""

import json
import os
import signal
import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

from celery_leader.dramatiq import LeaderMiddleware, every
from celery_leader.dramatiq import scheduler as _scheduler
from celery_leader.schedule.jobs import Outcome

BROKER_URL = os.environ["BROKER_URL"]
STORE_URL = os.environ.get("STORE_URL", BROKER_URL)
broker: dramatiq.Broker
if BROKER_URL.startswith("amqp"):
    broker = RabbitmqBroker(url=BROKER_URL)
else:
    broker = RedisBroker(url=BROKER_URL)
broker.add_middleware(CurrentMessage())
broker.add_middleware(LeaderMiddleware(url=STORE_URL))
dramatiq.set_broker(broker)

_redis = redis.Redis.from_url(STORE_URL, decode_responses=True)


@dramatiq.actor(max_retries=0)
def work(seconds: float = 0.0) -> None:
    """Record the run and sleep."""
    message = CurrentMessage.get_current_message()
    slot = None if message is None else message.options.get("leader_slot")
    _redis.rpush("runs", json.dumps({"slot": slot, "pid": os.getpid(), "start": time.time()}))
    time.sleep(seconds)


if os.environ.get("EVERY"):

    @dramatiq.actor(max_retries=0, leader_schedule=every(float(os.environ["EVERY"])))
    def tick() -> None:
        """Record the run."""
        work.fn(float(os.environ.get("TICK_SECONDS", "0")))


if os.environ.get("PAUSE_AT") or os.environ.get("LOSE_AT"):
    _send = _scheduler._EnqueueAdapter.send
    _sent = [0]

    def _pausing_send(self: Any, job: Any, slot: str, due: Any, epoch: int) -> Any:
        _sent[0] += 1
        if _sent[0] == int(os.environ.get("PAUSE_AT", "0")):
            print(f"pausing before publishing slot {slot}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if _sent[0] == int(os.environ.get("LOSE_AT", "0")):
            print(f"losing slot {slot}", flush=True)
            return Outcome()
        return _send(self, job, slot, due, epoch)

    _scheduler._EnqueueAdapter.send = _pausing_send  # type: ignore[method-assign]
