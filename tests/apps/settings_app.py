"""Celery and Dramatiq apps for the bad-settings tests, on in-memory brokers.

Every ``CELERY_LEADER_*`` environment variable becomes the ``leader_*`` setting of
that name on the Celery app. With ``DJANGO_SETTINGS_MODULE`` set, the Celery app
reads Django's settings instead, as ``config_from_object(namespace="CELERY")``.
The Dramatiq broker's ``LeaderMiddleware`` reads the same variables itself.
"""

import os

import dramatiq
from celery import Celery
from dramatiq.brokers.stub import StubBroker

from celery_leader import leader_only
from celery_leader.dramatiq import LeaderMiddleware, every

app = Celery("settings_app", broker="memory://")
app.conf.beat_scheduler = "celery_leader.celery.beat:LeaderScheduler"
if os.environ.get("DJANGO_SETTINGS_MODULE"):
    app.config_from_object("django.conf:settings", namespace="CELERY")
else:
    for _name, _value in os.environ.items():
        if _name.startswith("CELERY_LEADER_"):
            app.conf[_name.removeprefix("CELERY_").lower()] = _value


@app.task
@leader_only
def report() -> None:
    """A leader-only task: the worker joins the elections, so it checks the store."""


def dramatiq_broker() -> dramatiq.Broker:
    """A stub broker with the scheduler-running middleware (built on import of ``dq``)."""
    broker = StubBroker()
    broker.add_middleware(LeaderMiddleware(scheduler=True))
    dramatiq.set_broker(broker)

    @dramatiq.actor(leader_schedule=every(60))
    def tick() -> None:
        """A scheduled actor, so the scheduler has an entry."""

    return broker
