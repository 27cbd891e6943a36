"""Leader-only actors' messages: run only on the process that leads, no message lost or run twice.

:class:`LeaderOnly` checks each message of a leader-only actor: on the leader
it runs under the epoch the check read; on a follower it is skipped (``skip``
mode) or held (``wait`` mode, the default). Dramatiq's own
``ConsumerThread.pause()`` is not enough for ``wait``:

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
  demotion is held the same way (:meth:`Gate.hold`, from :class:`LeaderOnly`).
* The consumer is paused only once no message it delivered is still in the
  process (handed to a worker and not yet acked or held), so its close returns
  what was held and never what ran. After the close it resumes if this process
  leads again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dramatiq.common import q_name
from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage

from .. import body_epoch
from ..pins import role_of
from ..process import after_fork_in_child

if TYPE_CHECKING:
    from .middleware import ActorRules

logger = logging.getLogger(__name__)

#: Longest wait for a consumer to pause when a test pins a follower: its idle
#: timeout plus Dramatiq's restart delay (3 s unless ``dramatiq_restart_delay``).
PAUSE_TIMEOUT = 10.0


class LeaderOnly(Middleware):
    """Lets a leader-only actor's message through only on the leading process.

    Fails closed: any error here skips the message, because Dramatiq runs the
    actor when a middleware raises anything but a ``MiddlewareError``. A
    message let through runs with the epoch the check read: the lease may end
    before the actor's first line (a resign), and ``current_epoch()`` in the
    actor still answers the epoch it passed with (:mod:`celery_leader.body_epoch`).
    """

    def __init__(self, rules: ActorRules, epoch: Callable[[str], int | None], gates: Gates) -> None:
        self._rules = rules
        self._epoch = epoch  # of this process's term of an election, else None
        self._gates = gates

    def before_process_message(self, broker: Any, message: Any) -> None:
        """Run the message here, or skip it (and hold it, on a wait-mode queue)."""
        try:
            rule = self._rules.leader_only.get(message.actor_name)
            if rule is None or rule.election is None:
                return
            try:
                epoch = self._epoch(rule.election)
                if epoch is not None:
                    body_epoch.only(rule.election, epoch)
                    return
            except Exception:
                logger.exception(
                    "celery-leader: leadership check of %r failed; not running %s",
                    rule.election,
                    message.actor_name,
                )
            if not self._gates.hold(message):
                logger.info(
                    "celery-leader: skipping %s (%s): this process does not lead %r",
                    message.actor_name,
                    message.message_id,
                    rule.election,
                )
        except MiddlewareError:
            raise
        except BaseException:
            logger.exception("celery-leader: error in the leader check; skipping the message")
        raise SkipMessage(f"not the leader of a leader-only actor: {message.actor_name}")

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        """The body's epoch ends with it (or with its skip)."""
        body_epoch.only(None)

    after_skip_message = after_process_message


class Gates(Middleware):
    """The gates of this process's wait-mode queues, opened and closed as leadership changes."""

    def __init__(self, rules: ActorRules, leads: Callable[[str], bool]) -> None:
        self._rules = rules
        self._leads = leads  # whether this process leads an election now
        self._gates: dict[str, Gate] = {}  # wait-mode queue -> its consumer's gate
        after_fork_in_child(self._forget_parent)

    def after_consumer_thread_boot(self, broker: Any, thread: Any) -> None:
        """Gate a wait-mode queue's consumer.

        Runs in the consumer thread before it first consumes, so no message gets past.
        """
        queue = thread.queue_name
        rule = self._rules.of_queue(queue)
        if rule.election is not None and rule.mode == "wait" and queue == q_name(queue):
            election = rule.election
            self._gates[queue] = Gate(thread, election, lambda: self._leads(election))

    def hold(self, message: Any) -> bool:
        """Hold ``message`` if its queue is gated (see :meth:`Gate.hold`); say whether it was."""
        gate = self._gates.get(message.queue_name)
        if gate is not None:
            gate.hold(message)
        return gate is not None

    def update(self, election: str) -> None:
        """Leadership of ``election`` changed: open or close the gates of its queues."""
        for gate in list(self._gates.values()):
            if gate.election == election:
                gate.update()

    def update_all(self) -> None:
        """Open or close every gate to match who leads (a test's pin, else the lease).

        Returns once each consumer a pin made a follower has paused, so that a
        message the test sends next stays in the queue: a consumer that took it
        would hold it, and ``StubBroker`` cannot take a held message back.
        """
        for gate in list(self._gates.values()):
            gate.update()
            pin = role_of(gate.election)
            if pin is not None and not pin.leads and gate.thread.is_alive():
                gate.thread.paused_event.wait(PAUSE_TIMEOUT)

    def shut_down(self) -> None:
        """The process stops: each gated consumer ends its loop rather than pause."""
        for gate in list(self._gates.values()):
            gate.shut_down()

    def _forget_parent(self) -> None:
        # A forked child has none of its parent's consumer threads.
        self._gates = {}


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
            # Fail closed, as LeaderOnly does.
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
