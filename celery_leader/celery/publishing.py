"""Beat's publishes: confirmed by the broker, and classified when they fail.

A leader hands a claimed slot back only when it *knows* the broker does not have
it: sending a slot of unknown fate again could run it twice. On RabbitMQ
(py-amqp) each publish waits for the broker's confirm: a message not written
completely, or nacked, is definitely not sent; one written and unanswered is
:class:`PublishOutcomeUnknown`. Other transports' errors are classified by
:func:`known_unsent`. A connection that saw a failure is dropped without the
close handshake (which would wait on a stalled link) and reopened.
"""

from __future__ import annotations

import logging
import select
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..exceptions import missing_extra
from ..schedule.jobs import NOT_CONNECTED, Outcome, caused_by

try:
    from celery.exceptions import QueueNotFound
    from kombu.exceptions import EncodeError
    from kombu.messaging import Producer
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

logger = logging.getLogger(__name__)

#: Tries to open the broker connection before a slot counts as not sent. One
#: retry rides out a broker that closed an idle connection; more would hold a
#: claimed slot back from the next leader while this one cannot reach the broker.
CONNECT_RETRIES = 1

#: kombu's own flush threshold for a pipeline, in broker commands: above what
#: the slot protocol buffers between its flushes, so that it decides them.
PIPELINE_COMMANDS = 100_000


class PublishOutcomeUnknown(Exception):
    """A message was written to the broker and its confirm never came back."""


def known_unsent(error: BaseException) -> bool:
    """Whether ``error`` happened before any message could reach the broker (no
    connection, a message not serializable, a queue not routable)."""
    return caused_by(error, (*NOT_CONNECTED, EncodeError, QueueNotFound))


class _Record:
    """What the publishes of one slot did: ``"none"``, ``"unknown"`` or ``"acked"``, and
    the failure kept for it, if any."""

    def __init__(self) -> None:
        self.state = "none"
        self.error: BaseException | None = None


def keep_failure(producer: Any, error: BaseException) -> bool:
    """Keep ``error`` as the failure of the slot ``producer`` publishes; False when
    ``producer`` is not a :class:`BeatPublisher`'s (no slot is being sent with it)."""
    if not isinstance(producer, _Confirming):
        return False
    producer._record.error = error
    return True


class _Confirming:
    """Mixin for a kombu producer (a scheduler's own ``Producer`` keeps working): its
    py-amqp channels confirm and report every publish."""

    channel: Any
    _record: _Record
    _confirm_timeout: float

    def _publish(self, *args: Any, **kwargs: Any) -> Any:
        # Called again by kombu's retry after a reconnect, on the new channel.
        channel = self.channel
        if _is_amqp(channel) and not getattr(channel, "_celery_leader_confirms", False):
            channel.confirm_select()
            channel.basic_publish = _confirmed(channel, self._record, self._confirm_timeout)
            channel._celery_leader_confirms = True
        return super()._publish(*args, **kwargs)  # type: ignore[misc]


def _pipelines(producer: Any) -> bool:
    # kombu before 5.7 has no Producer.batch; transports that cannot pipeline
    # safely (AMQP, or Redis with retries that could replay one) say so.
    return bool(getattr(producer, "supports_batch_publish", False))


def _is_amqp(channel: Any) -> bool:
    # py-amqp channels: the transport most RabbitMQ users run (pyamqp://, amqp://).
    return hasattr(channel, "_basic_publish") and hasattr(channel, "confirm_select")


def _confirmed(channel: Any, record: _Record, default_timeout: float) -> Any:
    # py-amqp comes with kombu's AMQP transport; only its channels get here.
    from amqp import spec  # type: ignore[import-untyped]
    from amqp.exceptions import ChannelError, MessageNacked  # type: ignore[import-untyped]

    def publish(
        message: Any, *args: Any, confirm_timeout: float | None = None, **kwargs: Any
    ) -> Any:
        _raise_if_closed(channel)
        # Raises before the message is complete on the wire: the broker drops a
        # partial message, so kombu may safely reconnect and write it again.
        result = channel._basic_publish(message, *args, **kwargs)
        record.state = "unknown"
        answer: list[Any] = []
        try:
            channel.wait(
                [spec.Basic.Ack, spec.Basic.Nack],
                callback=lambda method, *_: answer.append(method),
                timeout=confirm_timeout or default_timeout,
            )
        except ChannelError:
            # The broker closed the channel over this publish (no such exchange):
            # it did not take the message.
            record.state = "none"
            raise
        except Exception as exc:
            raise PublishOutcomeUnknown(
                f"written, and no publisher confirm came ({type(exc).__name__}: {exc}; "
                f"waited at most {confirm_timeout or default_timeout:g} s)"
            ) from exc
        if answer and answer[0] == spec.Basic.Nack:
            record.state = "none"
            raise MessageNacked("the broker refused the message (basic.nack)")
        record.state = "acked"
        return result

    return publish


def _raise_if_closed(channel: Any) -> None:
    """Read what the broker sent since the last publish, if anything, before writing: a
    link closed while idle raises here, before the slot goes into a dead socket."""
    connection = channel.connection
    sock = getattr(getattr(connection, "transport", None), "sock", None)
    if sock is None:
        return
    readable, _, _ = select.select([sock], [], [], 0)
    if readable:
        try:
            connection.drain_events(timeout=0.1)
        except TimeoutError:
            pass


class BeatPublisher:
    """The leading beat's broker connection and producer (see the module docstring)."""

    def __init__(self, app: Any, confirm_timeout: float, producer_cls: type = Producer) -> None:
        self.app = app
        self.confirm_timeout = confirm_timeout
        self._producer_cls = type(
            f"Confirming{producer_cls.__name__}", (_Confirming, producer_cls), {}
        )
        self._record = _Record()
        self._connection: Any = None
        self._producer: Any = None
        self._confirms = False
        self._pipelining = False  # inside pipelined()
        self._batch: Any = None  # the producer's open kombu batch, if any

    def producer(self) -> Any:
        """A connected producer; raises (definitely unsent) when the broker is unreachable."""
        if self._producer is None:
            connection = self.app.connection_for_write()
            try:
                connection.ensure_connection(max_retries=CONNECT_RETRIES, interval_start=0.2)
                self._confirms = _is_amqp(connection.default_channel)
            except Exception:
                connection.collect()
                raise
            self._connection = connection
            producer = self._producer_cls(connection, auto_declare=False)
            producer._record = self._record
            producer._confirm_timeout = self.confirm_timeout
            self._producer = producer
        if self._pipelining and self._batch is None and _pipelines(self._producer):
            batch = self._producer.batch(max_size=PIPELINE_COMMANDS)
            batch.__enter__()
            self._batch = batch
        self._record.state, self._record.error = "none", None
        return self._producer

    def send(self, publish: Callable[[Any], object]) -> Outcome:
        """Publish one slot, ``publish(producer)``, and say what became of it."""
        try:
            producer = self.producer()
        except Exception as exc:  # no broker connection: nothing was sent
            return Outcome(exc, True)
        record = self._record
        try:
            publish(producer)
        except Exception as exc:
            # A hook of apply_entry raised before sending; or, after apply_async
            # kept the real failure and returned None, Celery before 5.4 failed
            # reading that None's id: the failure kept is the one that counts.
            record.error = record.error or exc
        error = record.error
        return Outcome() if error is None else Outcome(error, self.definitely_unsent(error))

    @contextmanager
    def pipelined(self) -> Iterator[None]:
        """Buffer the publishes of this block where the transport pipelines them (what
        is not flushed by its end is dropped)."""
        self._pipelining = True
        try:
            yield
        finally:
            self._pipelining = False
            self._close_batch()

    def flush(self) -> Outcome:
        """Send the buffered publishes: the outcome of every publish it carried."""
        if self._batch is not None:
            self._record.state = "none"
            try:
                self._batch.flush()
            except Exception as exc:
                self._close_batch()
                return Outcome(exc, self.definitely_unsent(exc))
        return Outcome()

    def _close_batch(self) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:
            try:
                # As if the block had raised: kombu discards what is unflushed.
                batch.__exit__(RuntimeError, None, None)
            except Exception as exc:
                logger.debug("celery-leader: closing a publish pipeline failed: %s", exc)

    def definitely_unsent(self, error: BaseException) -> bool:
        """Classify the failure of the publish that follows :meth:`producer`.

        Drops the connection (a late confirm would answer the next publish), except
        while a pipeline is open: buffering writes nothing, and :meth:`flush` still
        sends what was buffered before.
        """
        state, confirms = self._record.state, self._confirms
        if self._batch is None:
            self.release()
        if state != "none":
            return False  # written and unconfirmed, or confirmed before something else failed
        if confirms:
            return True  # every write of a message was recorded, and none happened
        return known_unsent(error)

    def release(self) -> None:
        """Drop the connection without the close handshake (a stalled link would hang it)."""
        self._close_batch()
        connection, self._connection, self._producer = self._connection, None, None
        self._confirms = False
        if connection is not None:
            try:
                connection.collect()
            except Exception as exc:
                logger.debug("celery-leader: dropping the broker connection failed: %s", exc)
