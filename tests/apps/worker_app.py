"""A Celery app for worker tests: everything comes from environment variables.

BROKER_URL (Redis: broker, result backend, leader store and the record of who
ran what; or RabbitMQ, with STORE_URL the Redis for the rest), LEADER_TTL, and
optionally QUEUES (how queues are declared: "quorum", "no-missing",
"explicit", "renamed", and the refused "broadcast" and "only-leader"; see
below), POOL_START_METHOD ("fork" or "spawn"),
FENCE ("1" turns on leader_fence_tasks) and BEAT_TASK (``celery beat`` sends
that task of this module every BEAT_EVERY seconds, default 1).

Tasks record each run in Redis: ``ran:<tag>`` gets the node name once per run
of the body, ``runs`` gets ``<tag> <node> <monotonic time>``, and ``done:<tag>``
gets ``<state> <node>`` whenever an attempt ends (SUCCESS, IGNORED, RETRY...).
Tasks sent by beat are tagged with their ``leader_slot``; every delivery of
one (an attempt that starts, whatever it does) is pushed on ``deliveries``,
and every run of its body on ``slots`` as JSON with the wall-clock time.
CLOCK_MONOTONIC is one clock for the whole machine, so the test compares it
with its own.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, current_task, signals
from kombu import Exchange, Queue
from kombu.common import Broadcast

from celery_leader import is_leader, leader_only

BROKER_URL = os.environ["BROKER_URL"]
STORE_URL = os.environ.get("STORE_URL", BROKER_URL)

app = Celery("worker_app", broker=BROKER_URL, backend=STORE_URL)
app.conf.leader_url = STORE_URL
QUEUES = os.environ.get("QUEUES")
if QUEUES == "quorum":
    # Celery 5.5's quorum setup: missing queues are quorum queues on topic exchanges,
    # so that native delayed delivery (countdown/eta) works for them.
    app.conf.task_create_missing_queue_type = "quorum"
    app.conf.task_create_missing_queue_exchange_type = "topic"
    app.conf.task_queues = [
        Queue(
            "celery",
            Exchange("celery", "topic"),
            "celery",
            queue_arguments={"x-queue-type": "quorum"},
        )
    ]
elif QUEUES == "no-missing":
    app.conf.task_create_missing_queues = False
elif QUEUES == "explicit":
    # The leader queue listed among the user's own (as quorum): used as declared.
    app.conf.task_create_missing_queues = False
    app.conf.task_queues = [
        Queue("celery"),
        Queue("celery_leader.leader.worker", queue_arguments={"x-queue-type": "quorum"}),
    ]
elif QUEUES == "renamed":
    app.conf.task_default_queue = "jobs"
elif QUEUES == "broadcast":  # refused: every worker would get a copy
    app.conf.task_queues = [Queue("celery"), Broadcast("celery_leader.leader.worker")]
elif QUEUES == "only-leader":  # refused: the worker would consume nothing while following
    app.conf.task_queues = [Queue("celery_leader.leader.worker")]
    app.conf.task_default_queue = "elsewhere"
app.conf.leader_ttl = float(os.environ.get("LEADER_TTL", "2"))
app.conf.leader_fence_tasks = os.environ.get("FENCE") == "1"
app.conf.leader_health_file = os.environ.get("HEALTH_FILE")
app.conf.leader_metrics_port = os.environ.get("METRICS_PORT")
app.conf.leader_health_port = os.environ.get("HEALTH_PORT")
app.conf.worker_pool_start_method = os.environ.get("POOL_START_METHOD", "fork")
# One message at a time per pool slot: a node does not hoard what another could run.
app.conf.worker_prefetch_multiplier = 1
app.conf.broker_connection_retry_on_startup = True
if os.environ.get("BEAT_TASK"):
    app.conf.beat_schedule = {
        "slot": {
            "task": f"worker_app.{os.environ['BEAT_TASK']}",
            "schedule": float(os.environ.get("BEAT_EVERY", "1")),
        }
    }

_redis = redis.Redis.from_url(STORE_URL)


def _record(tag: str) -> None:
    node = current_task.request.hostname
    _redis.rpush(f"ran:{tag}", node)
    _redis.rpush("runs", f"{tag} {node} {time.monotonic():.6f}")


def _record_slot() -> None:
    request = current_task.request
    slot = request.leader_slot
    _record(slot)
    _redis.rpush(
        "slots",
        json.dumps(
            {
                "slot": slot,
                "epoch": request.leader_epoch,
                "node": request.hostname,
                "at": time.time(),
                "retries": request.retries,
            }
        ),
    )


@app.task(name="worker_app.slot_task")
@leader_only
def slot_task() -> None:
    """Default settings: what beat sends runs once, on the leader."""
    _record_slot()


@app.task(name="worker_app.retry_once_task", bind=True)
@leader_only
def retry_once_task(self: Any) -> None:
    """Works RETRY_AFTER seconds, then retries once (as after a flaky call) and runs.

    The retry is published when the first attempt ends: a beat hand-over
    meanwhile puts a retry of the old epoch in flight.
    """
    if self.request.retries == 0:
        time.sleep(float(os.environ.get("RETRY_AFTER", "1.5")))
        raise self.retry(countdown=0)
    _record_slot()


@app.task
@leader_only
def wait_task(tag: str) -> None:
    _record(tag)


@app.task(acks_late=True)
@leader_only(on_follower="reject")
def reject_task(tag: str) -> None:
    _record(tag)


@app.task
@leader_only(on_follower="skip")
def skip_task(tag: str) -> None:
    _record(tag)


@app.task
@leader_only(on_follower="retry", retry_backoff=0.2)
def retry_task(tag: str) -> None:
    _record(tag)


@app.task
def plain_task(tag: str) -> None:
    """Not gated itself: lets the fencing tests see which messages ran."""
    _record(tag)


@app.task
def sleep_task(tag: str, seconds: float) -> None:
    """Keeps a pool slot busy, to show what a shutdown does while tasks run."""
    _redis.rpush(f"started:{tag}", current_task.request.hostname)
    time.sleep(seconds)
    _record(tag)


@app.task
def latched_task(tag: str) -> None:
    """Keeps a pool slot busy until the test pushes on ``release:<tag>`` (60 s at most)."""
    _redis.rpush(f"started:{tag}", current_task.request.hostname)
    _redis.blpop([f"release:{tag}"], timeout=60)
    _record(tag)


@app.task
def probe(tag: str, seconds: float) -> None:
    """Sample this pool process's view of leadership every 10 ms for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _redis.rpush(f"probe:{tag}", json.dumps([time.monotonic(), is_leader()]))
        time.sleep(0.01)


@signals.task_prerun.connect
def _delivered(task: Any = None, args: tuple[object, ...] = (), **_: object) -> None:
    request = current_task.request
    tag = getattr(request, "leader_slot", None) or (args[0] if args else request.id)
    _redis.rpush("deliveries", f"{tag} {request.hostname}")


@signals.task_postrun.connect
def _done(task: object = None, args: tuple[object, ...] = (), state: str = "", **_: object) -> None:
    if args:
        node = current_task.request.hostname
        _redis.rpush(f"done:{args[0]}", f"{state} {node}")
