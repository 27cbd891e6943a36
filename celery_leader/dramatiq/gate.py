"""Wait-mode queues: consumed only while this process leads, and no message lost or run twice.

Dramatiq's own ``ConsumerThread.pause()`` is not enough for that:

* a paused consumer stops only at its next idle poll, so while messages flow it
  keeps taking them;
* ``requeue()`` of Dramatiq's RabbitMQ consumer does nothing (RabbitMQ returns
  unacked messages when the consumer's connection closes), so a message that is
  skipped and then acked is lost;
* when a paused consumer stops, it closes its connection, and RabbitMQ delivers
  again every message that was not acked yet: one still running would run twice.

So every wait-mode queue's consumer thread gets a :class:`Gate`:

* A message delivered while this process does not lead is *held*: never handed
  to a worker thread and never acked. Redis gets it back at once (``requeue``),
  RabbitMQ when the consumer closes. Held messages stay unacked, so they fill
  the prefetch window and the broker stops delivering.
* A message handed to a worker thread while leading but started after a
  demotion is held the same way (:meth:`Gate.hold`, from the middleware).
* The consumer is paused only once no message it delivered is still in the
  process (handed to a worker and not yet acked or held), so its close returns
  what was held and never what ran. After the close it resumes if this process
  leads again.

And :func:`liveness` tells a :class:`~celery_leader.health.ConsumerLiveness`
(the same as a Celery worker's) when a consumer thread goes round its loop, so
a process whose consumers cannot reach the broker hands its elections over.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..health import ConsumerLiveness

logger = logging.getLogger(__name__)


class Gate:
    """Lets a wait-mode queue's consumer thread hand messages to workers only while leading."""

    def __init__(self, thread: Any, election: str, leading: Callable[[], bool]) -> None:
        self.thread = thread
        self.election = election
        self._leading = leading
        self._lock = threading.Lock()
        self._in_flight = 0  # handed to a worker thread, not yet acked or held
        self._held: set[str] = set()  # ids held by a worker thread: their ack is skipped
        self._dirty = False  # this consumer holds messages that only its close returns
        self._stopping = True  # paused by the gate and not closed since
        self._closed = True  # closed (or never opened) since the gate paused it
        self._open = False  # the thread has a consumer open (it went round its loop)
        self._shutting_down = False  # the process stops: end the loop, do not pause
        self._original_handle = thread.handle_message
        self._original_post_process = thread.post_process_message
        self._original_close = thread.close
        self._original_delayed = thread.handle_delayed_messages
        # Instance attributes win over ConsumerThread's methods: the worker and
        # consumer threads call these through the thread object.
        thread.handle_message = self._handle_message
        thread.post_process_message = self._post_process_message
        thread.close = self._close
        thread.handle_delayed_messages = self._handle_delayed_messages
        # No consumer before the first election: the thread starts paused.
        thread.pause()
        self.update()

    def update(self) -> None:
        """Leadership changed: pause once drained, or resume a consumer that has closed."""
        with self._lock:
            if self._leads() and not self._dirty and self._stopping and self._closed:
                self._stopping = False
                self.thread.resume()
                resumed = True
            else:
                resumed = False
        if resumed:
            logger.info(
                "celery-leader: consuming queue %r (leader of %r)",
                self.thread.queue_name,
                self.election,
            )
        self._settle()

    def shut_down(self) -> None:
        """The process is stopping: once drained, end the consumer's loop instead of pausing it.

        Dramatiq's consumer leaves its loop when paused and, while its worker still
        runs, sleeps its restart delay (3 s) before looking again; a worker that is
        shutting down then waits for that sleep. A stopped consumer leaves its loop at
        its next poll and does not sleep; the worker's stop closes it as usual, which
        returns what it held. Nothing it delivered is in the process by then, so
        nothing is left to ack.
        """
        with self._lock:
            self._shutting_down = True
        self._settle()

    def hold(self, message: Any) -> None:
        """In a worker thread: neither run ``message`` nor ack it (see the module doc)."""
        with self._lock:
            self._held.add(message.message_id)
        self._give_back(message)

    def _give_back(self, message: Any) -> None:
        logger.info(
            "celery-leader: returning %s (%s) to queue %r: this process does not lead %r",
            message.actor_name,
            message.message_id,
            self.thread.queue_name,
            self.election,
        )
        with self._lock:
            self._dirty = True
        # Redis takes it back now; RabbitMQ's requeue does nothing, its close does.
        self.thread.requeue_messages([message])

    # -- the consumer thread's methods --------------------------------------

    def _leads(self) -> bool:
        try:
            return self._leading()
        except Exception:
            # Fail closed, as the middleware's own check does.
            logger.exception("celery-leader: leadership check of %r failed", self.election)
            return False

    def _accepting(self) -> bool:
        return not self._dirty and not self._stopping and self._leads()

    def _handle_delayed_messages(self) -> None:
        # Called after every message and idle poll of an open consumer.
        self._open = True
        self._original_delayed()

    def _handle_message(self, message: Any) -> None:
        with self._lock:
            self._open = True
            accepting = self._accepting()
            if accepting:
                self._in_flight += 1
        if accepting:
            self._original_handle(message)
            return
        # Held here, in the consumer thread: never handed to a worker, never acked.
        self._give_back(message)
        self._settle()

    def _post_process_message(self, message: Any) -> None:
        with self._lock:
            held = message.message_id in self._held
            self._held.discard(message.message_id)
        try:
            if not held:
                self._original_post_process(message)
        finally:
            with self._lock:
                self._in_flight -= 1
            self._settle()

    def _close(self) -> None:
        self._original_close()
        with self._lock:
            self._open = False
            self._dirty = False
            if self._stopping:
                self._closed = True
        self.update()

    def _settle(self) -> None:
        """Pause the consumer when it must stop and nothing it delivered is in the process."""
        with self._lock:
            leading = self._leads()
            if self._stopping or self._in_flight or (leading and not self._dirty):
                return
            self._stopping = True
            # A thread that has no consumer open (it is still in Dramatiq's
            # paused sleep) will not close one: nothing of it to wait for.
            self._closed = not self._open
            if self._shutting_down:
                self.thread.stop()
            else:
                self.thread.pause()
            verb = "stopped" if self._shutting_down else "paused"
        logger.info(
            "celery-leader: %s queue %r (%s)",
            verb,
            self.thread.queue_name,
            "returning held messages" if leading else f"not leading {self.election!r}",
        )


def liveness(thread: Any, grace: float) -> ConsumerLiveness:
    """The liveness of a consumer thread, told each time it goes round its loop.

    Dramatiq's consumer loop calls ``handle_delayed_messages`` after every
    message and every idle poll (at most ``worker_timeout`` apart). A consumer
    whose connection failed sits in Dramatiq's restart delay instead, retrying,
    and so falls silent.
    """
    found = ConsumerLiveness(f"consumer of {thread.queue_name!r}", grace)
    original = thread.handle_delayed_messages

    def handle_delayed_messages() -> None:
        found.alive()
        original()

    thread.handle_delayed_messages = handle_delayed_messages
    return found
