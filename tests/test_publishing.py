"""Beat's publisher on a real RabbitMQ: what each kind of failure means for the slot.

``BeatPublisher`` (``celery_leader/celery/publishing.py``) confirms every publish and
tells "definitely not sent" (hand the slot back) from "outcome unknown" (keep it
claimed). Issue 19 found both kinds taken for "the broker may have it", and lost
publishes not reported at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import kombu
import pytest
from celery import Celery
from celery.exceptions import QueueNotFound

from celery_leader.celery.publishing import BeatPublisher, PublishOutcomeUnknown
from harness.proxy import TcpProxy
from harness.servers import RabbitServer

pytestmark = pytest.mark.rabbitmq


def make_app(broker_url: str, **conf: object) -> Celery:
    app = Celery("publishing", broker=broker_url, set_as_current=False)
    app.conf.update(conf)
    return app


def depth(url: str, queue: str) -> int:
    with kombu.Connection(url) as conn:
        return int(conn.default_channel.queue_declare(queue, passive=True).message_count)


def send(publisher: BeatPublisher, app: Celery, **options: object) -> BaseException | None:
    """One publish as beat makes it; the error it raised, if any."""
    try:
        app.send_task("publishing.noop", producer=publisher.producer(), **options)  # type: ignore[arg-type]
    except Exception as exc:
        return exc
    return None


@pytest.fixture
def publishers() -> Iterator[list[BeatPublisher]]:
    made: list[BeatPublisher] = []
    yield made
    for publisher in made:
        publisher.release()


def make_publisher(app: Celery, made: list[BeatPublisher], timeout: float = 1.0) -> BeatPublisher:
    publisher = BeatPublisher(app, confirm_timeout=timeout)
    made.append(publisher)
    return publisher


def test_a_confirmed_publish_is_in_the_queue(
    amqp_url: str, publishers: list[BeatPublisher]
) -> None:
    app = make_app(amqp_url)
    publisher = make_publisher(app, publishers)
    assert send(publisher, app) is None
    assert depth(amqp_url, "celery") == 1


@pytest.mark.parametrize(
    ("conf", "options", "expected"),
    [
        ({"task_create_missing_queues": False}, {"queue": "nope"}, QueueNotFound),
        # The worker declared "typed" classic; this sender declares it quorum (a 406).
        ({"task_create_missing_queue_type": "quorum"}, {"queue": "typed"}, Exception),
        # No such exchange: RabbitMQ closes the channel over the publish (a 404).
        ({}, {"exchange": "missing", "routing_key": "x"}, Exception),
    ],
    ids=["queue-not-found", "precondition-failed", "no-such-exchange"],
)
def test_errors_before_the_broker_took_the_message_are_definitely_unsent(
    amqp_url: str,
    publishers: list[BeatPublisher],
    conf: dict[str, object],
    options: dict[str, object],
    expected: type[BaseException],
) -> None:
    with kombu.Connection(amqp_url) as conn:
        conn.default_channel.queue_declare("typed", durable=True, auto_delete=False)
    app = make_app(amqp_url, **conf)
    publisher = make_publisher(app, publishers)
    error = send(publisher, app, **options)
    assert isinstance(error, expected), error
    assert publisher.definitely_unsent(error)
    # The next publish goes out on a fresh connection.
    assert send(publisher, app) is None


def test_a_publish_into_a_stalled_link_has_an_unknown_outcome(
    rabbitmq_server: RabbitServer,
    amqp_url: str,
    publishers: list[BeatPublisher],
    tcp_proxy: Callable[[str, int], TcpProxy],
) -> None:
    proxy = tcp_proxy("127.0.0.1", rabbitmq_server.port)
    app = make_app(proxy.url_for(amqp_url))
    publisher = make_publisher(app, publishers, timeout=0.5)
    assert send(publisher, app) is None
    proxy.hold()
    error = send(publisher, app)
    assert isinstance(error, PublishOutcomeUnknown), error
    assert not publisher.definitely_unsent(error)
    proxy.release()


def test_a_link_reset_while_idle_is_noticed_before_writing(
    rabbitmq_server: RabbitServer,
    amqp_url: str,
    publishers: list[BeatPublisher],
    tcp_proxy: Callable[[str, int], TcpProxy],
) -> None:
    # Issue 19: a plain connection reset lost the first slot published after it.
    proxy = tcp_proxy("127.0.0.1", rabbitmq_server.port)
    app = make_app(proxy.url_for(amqp_url))
    publisher = make_publisher(app, publishers)
    assert send(publisher, app) is None
    proxy.cut()
    assert send(publisher, app) is None
    assert depth(amqp_url, "celery") == 2
