# dramatiq_user/app.py
import os

import dramatiq
from celery_leader.dramatiq import LeaderMiddleware, current_epoch

if os.environ.get("UNIT_TESTS") == "1":
    from dramatiq.brokers.stub import StubBroker

    broker = StubBroker()
else:
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=os.environ["REDIS_URL"])
broker.add_middleware(LeaderMiddleware())  # its settings from CELERY_LEADER_* variables
dramatiq.set_broker(broker)

refreshed = []
rebuilt = []


@dramatiq.actor(leader_only=True, queue_name="prices")  # a follower skips it
def refresh_prices():
    refreshed.append(current_epoch())


@dramatiq.actor(leader_only=True, leader_on_follower="wait", queue_name="index")
def rebuild_index():
    rebuilt.append(current_epoch())
