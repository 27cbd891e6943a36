"""The soak benchmark's Celery app: beat replicas and workers on one Redis.

Configured by environment:

BROKER_URL      Redis: the broker, the lease store and the run ledger (db 0)
INSTANCE_ID     ``leader_instance_id``: which process leads, for the benchmark's faults
RUNS_URL        Redis database where every run of the task's body pushes its slot
                (read and emptied by the benchmark as it goes)

Every task is published to the topic exchange ``soak`` with routing key ``soak``
(a topic one: Celery publishes to a direct exchange's queue straight, by name);
the workers consume queue ``soak``, and the benchmark binds a second queue,
``soak.copy``, to the same exchange and key, so that the broker puts a copy of
every message there: what beat published, counted where it arrived. The entries
live in the store (the benchmark adds them); the app has no code entries.
"""

import json
import os

import redis
from celery import Celery, current_task
from kombu import Exchange, Queue

EXCHANGE = Exchange("soak", type="topic")
QUEUE, COPY_QUEUE = "soak", "soak.copy"

app = Celery("soak_app", broker=os.environ["BROKER_URL"])
app.conf.leader_url = os.environ["BROKER_URL"]
app.conf.leader_instance_id = os.environ.get("INSTANCE_ID")
app.conf.task_queues = [Queue(QUEUE, EXCHANGE, routing_key=QUEUE)]
app.conf.task_default_queue = QUEUE
app.conf.task_default_exchange = EXCHANGE.name
app.conf.task_default_routing_key = QUEUE
app.conf.worker_prefetch_multiplier = 4
app.conf.broker_connection_retry_on_startup = True
# A killed worker's unacknowledged messages come back after 30 s, not Redis's
# default hour, so that they are run within the run.
app.conf.broker_transport_options = {"visibility_timeout": 30}
app.conf.beat_schedule = {}

_runs = redis.Redis.from_url(os.environ.get("RUNS_URL", os.environ["BROKER_URL"]))


@app.task(name="soak.run", acks_late=True)
def run(**_: object) -> None:
    """Record that the body ran for this slot, by whom."""
    request = current_task.request
    slot = getattr(request, "leader_slot", None)
    _runs.rpush("soak:runs", json.dumps([slot, request.hostname, os.getpid()]))
