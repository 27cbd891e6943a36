"""One Celery app for every beat in the fail-over benchmark, configured by environment.

BROKER_URL      where tasks are published (read back by the benchmark)
BEAT_EVERY      seconds between runs of the single ``tick`` entry
LEADER_URL      celery-leader's store (through the replica's own TCP proxy)
LEADER_TTL      lease ttl, also redbeat's lock timeout
REDBEAT_URL     redbeat's Redis (through the replica's own TCP proxy)

Every message gets a ``bench_sent`` header (wall-clock send time), so that
duplicates can be counted by send time for schedulers that have no shared
notion of a slot (single-beat wraps the stock ``PersistentScheduler``).
"""

import os
import time

from celery import Celery
from celery.signals import before_task_publish

TTL = float(os.environ.get("LEADER_TTL", "3"))

app = Celery("bench_app", broker=os.environ["BROKER_URL"])
app.conf.beat_schedule = {
    "tick": {"task": "bench.noop", "schedule": float(os.environ.get("BEAT_EVERY", "0.1"))}
}
app.conf.leader_url = os.environ.get("LEADER_URL")
app.conf.leader_ttl = TTL
app.conf.leader_instance_id = os.environ.get("INSTANCE_ID")
app.conf.redbeat_redis_url = os.environ.get("REDBEAT_URL")
# redbeat tuned to the same ttl: the lock lives ``ttl`` seconds, and standbys,
# which retry the lock every ``beat_max_loop_interval``, poll once a second.
app.conf.redbeat_lock_timeout = TTL
app.conf.beat_max_loop_interval = 1


@app.task(name="bench.noop")
def noop() -> None:
    """Never executed: the benchmark reads the queue instead of running a worker."""


@before_task_publish.connect
def _stamp(headers: dict, **_: object) -> None:
    headers["bench_sent"] = time.time()
