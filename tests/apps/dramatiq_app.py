"""A Dramatiq app for the Dramatiq tests: everything comes from environment variables.

BROKER_URL (``redis://``: Redis broker; ``amqp://``: RabbitMQ), LEADER_URL,
LEADER_TTL, EMBEDDED (``1``: the scheduler runs in a ``dramatiq`` fork), EVERY
(seconds between ``tick`` slots), RECORD (a file where leader-only actors append
``actor message pid epoch``, the epoch being the one a run started under),
BODY_SECONDS (how long ``waiting`` and ``plain`` run), BREAK_CHECK (``1``:
every leadership check raises, to prove it fails closed) and QUORUM (``1``:
RabbitMQ quorum queues). The ``tick`` queue is
consumed by nobody, so the tests read the sent slots from the broker itself.
"""

import os
import time

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker

from celery_leader.dramatiq import LeaderMiddleware, current_epoch, every
from tests.apps.quorum import QuorumBroker

broker: dramatiq.Broker
if os.environ["BROKER_URL"].startswith("amqp"):
    rabbit = QuorumBroker if os.environ.get("QUORUM") == "1" else RabbitmqBroker
    broker = rabbit(url=os.environ["BROKER_URL"])
else:
    broker = RedisBroker(
        url=os.environ["BROKER_URL"],
        # A SIGKILLed worker's prefetched messages go back to the queue after this.
        heartbeat_timeout=5000,
        maintenance_chance=100_000,
    )
broker.add_middleware(
    LeaderMiddleware(
        url=os.environ["LEADER_URL"],
        ttl=float(os.environ.get("LEADER_TTL", "3")),
        scheduler=os.environ.get("EMBEDDED") == "1",
    )
)
dramatiq.set_broker(broker)

if os.environ.get("BREAK_CHECK") == "1":
    from celery_leader.election.lease import Lease

    def broken(self: Lease) -> bool:
        raise RuntimeError("injected failure of the leadership check")

    # The gate reads the epoch (a follower's never asks is_leader: it holds no
    # term), so both break, on every process, leader or not.
    Lease.is_leader = broken  # type: ignore[method-assign]
    Lease.epoch = property(broken)  # type: ignore[assignment,method-assign]


def record(actor: str, n: int, epoch: int | None) -> None:
    line = f"{actor} {n} {os.getpid()} {epoch}\n"
    fd = os.open(os.environ["RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@dramatiq.actor(queue_name="ticks", leader_schedule=every(float(os.environ.get("EVERY", "0.2"))))
def tick() -> None:
    """Sent by the scheduler; never consumed."""


@dramatiq.actor(queue_name="waiting", leader_only=True, leader_on_follower="wait")
def waiting(n: int) -> None:
    epoch = current_epoch()  # the term this run started under
    time.sleep(float(os.environ.get("BODY_SECONDS", "0.02")))
    record("waiting", n, epoch)


@dramatiq.actor(queue_name="plain", leader_only=True)
def plain(n: int) -> None:
    """Default options: waits, like ``waiting``."""
    epoch = current_epoch()
    time.sleep(float(os.environ.get("BODY_SECONDS", "0.02")))
    record("plain", n, epoch)


@dramatiq.actor(queue_name="skipping", leader_only=True, leader_on_follower="skip")
def skipping(n: int) -> None:
    record("skipping", n, current_epoch())
