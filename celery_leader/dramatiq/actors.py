"""Leader-only actors: their options, checked as each is declared, and their messages.

:class:`LeaderOnly` checks each message of a leader-only actor: on the leader it
runs under the epoch the check read; on a follower it is skipped or, in ``wait``
mode, held. Dramatiq's ``ConsumerThread.pause()`` is not enough for ``wait``: a
paused consumer stops only at its next idle poll; ``requeue()`` of its RabbitMQ
consumer does nothing (unacked messages return when the connection closes), so
a skipped and acked message is lost; and the close redelivers every unacked
message, so one still running would run twice. So each wait-mode queue's consumer
thread gets a :class:`Gate`: a message delivered, or started, while this process
does not lead is *held* (neither run nor acked: Redis gets it back at once,
RabbitMQ at the close), and the consumer is paused only once nothing it delivered
is in the process, so its close returns what was held and never what ran.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dramatiq.common import q_name
from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage

from ..election import body_epoch
from ..election.pins import role_of
from ..exceptions import ConfigError
from ..settings.config import validate_name
from ..settings.process import after_fork_in_child
from .cli_errors import one_line_errors
from .scheduler import schedules_of

logger = logging.getLogger(__name__)

#: What a follower does with a leader-only actor's message.
MODES = ("skip", "wait")


class LeaderActorError(ConfigError, MiddlewareError):
    """A leader option of an actor is invalid (a ``MiddlewareError``: Dramatiq logs and
    ignores any other error raised while an actor is declared, and the import must fail)."""


@dataclass(frozen=True)
class Rule:
    """How a queue's actors run: ``election`` ``None`` for ordinary actors."""

    election: str | None
    mode: str = "wait"


ORDINARY = Rule(None)


class ActorRules(Middleware):
    """The rule of each declared actor and queue; a bad one fails its declaration."""

    def __init__(self, worker_election: str) -> None:
        self.worker_election = worker_election  # what ``leader_only=True`` means
        #: Leader-only actor name -> its rule.
        self.leader_only: dict[str, Rule] = {}
        self._queues: dict[str, tuple[Rule, str]] = {}  # queue -> rule, an actor showing it
        self._entries: dict[str, str] = {}  # schedule entry name -> its actor

    @one_line_errors
    def before_declare_actor(self, broker: Any, actor: Any) -> None:
        """Check the actor's leader options; a bad one fails the import."""
        try:
            rule = self._rule_of(actor)
        except ConfigError as exc:
            raise LeaderActorError(f"actor {actor.actor_name!r}: {exc}") from None
        queue = actor.queue_name
        known = self._queues.get(queue)
        if known is not None and known[0] != rule and known[1] != actor.actor_name:
            raise LeaderActorError(
                f"queue {queue!r} mixes actor {actor.actor_name!r} ({_describe(rule)}) with "
                f"{known[1]!r} ({_describe(known[0])}): put leader-only actors on a queue of "
                "their own (queue_name=)"
            )
        for name in _entry_names(actor):
            owner = self._entries.setdefault(name, actor.actor_name)
            if owner != actor.actor_name:
                raise LeaderActorError(
                    f"actor {actor.actor_name!r}: a leader_schedule entry of actor {owner!r} "
                    f"is named {name!r} too: give one of them name="
                )
        self._queues[queue] = (rule, actor.actor_name)
        if rule.election is None:
            self.leader_only.pop(actor.actor_name, None)
        else:
            self.leader_only[actor.actor_name] = rule

    def of_queue(self, queue: str) -> Rule:
        """The rule of ``queue``'s actors; a delay queue's is its queue's."""
        return self._queues.get(q_name(queue), (ORDINARY, ""))[0]

    def elections(self, queues: Iterable[str]) -> set[str]:
        """The elections of the leader-only actors on ``queues`` (or their delay queues)."""
        return {rule.election for rule in map(self.of_queue, queues) if rule.election is not None}

    def _rule_of(self, actor: Any) -> Rule:
        options = actor.options
        names = _entry_names(actor)
        if len(set(names)) != len(names):
            raise ConfigError("two leader_schedule entries share a name: give them name=")
        only = options.get("leader_only", False)
        mode = options.get("leader_on_follower")
        if only is True:
            election: str | None = self.worker_election
        elif only is False or only is None:
            election = None
        elif isinstance(only, str):
            election = validate_name("leader_only", only)
        else:
            raise ConfigError(f"leader_only must be True, False or an election name (got {only!r})")
        if mode is None:
            mode = "wait"
        elif election is None:
            raise ConfigError("leader_on_follower needs leader_only=True (or an election name)")
        if mode not in MODES:
            raise ConfigError(f"leader_on_follower must be 'skip' or 'wait' (got {mode!r})")
        return Rule(election, mode) if election else ORDINARY


def _entry_names(actor: Any) -> list[str]:
    """Names of the schedule entries of ``actor`` (its name, or each schedule's ``name=``)."""
    schedules = schedules_of(actor.options.get("leader_schedule"))
    return [s.name or actor.actor_name for s in schedules]


def _describe(rule: Rule) -> str:
    if rule.election is None:
        return "ordinary"
    return f"leader_only {rule.election!r}, {rule.mode}"


#: Longest wait for a consumer to pause when a test pins a follower: its idle
#: timeout plus Dramatiq's restart delay (3 s unless ``dramatiq_restart_delay``).
PAUSE_TIMEOUT = 10.0


class LeaderOnly(Middleware):
    """Lets a leader-only actor's message through only on the leading process; fails closed
    (Dramatiq runs the actor when a middleware raises anything but a ``MiddlewareError``)."""

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
                msg = "celery-leader: leadership check of %r failed; not running %s"
                logger.exception(msg, rule.election, message.actor_name)
            if not self._gates.hold(message):
                msg = "celery-leader: skipping %s (%s): this process does not lead %r"
                logger.info(msg, message.actor_name, message.message_id, rule.election)
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
        """Gate a wait-mode queue's consumer; in its thread, before it first consumes."""
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

        Returns once each consumer a pin made a follower has paused: one that took the
        test's next message would hold it, and ``StubBroker`` cannot take it back."""
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
            resumed = self._leads() and not self._dirty and self._stopping and self._closed
            if resumed:
                self._stopping = False
                self.thread.resume()
        if resumed:
            msg = "celery-leader: consuming queue %r (leader of %r)"
            logger.info(msg, self.thread.queue_name, self.election)
        self._settle()

    def shut_down(self) -> None:
        """The process is stopping: once drained, end the consumer's loop instead of pausing it
        (a paused consumer sleeps Dramatiq's 3 s restart delay, and a stopping worker waits
        for that sleep). The worker's stop then closes it, returning what it held."""
        with self._lock:
            self._shutting_down = True
        self._settle()

    def hold(self, message: Any) -> None:
        """In a worker thread: neither run ``message`` nor ack it (see the module doc)."""
        with self._lock:
            self._held.add(message.message_id)
        self._give_back(message)

    def _give_back(self, message: Any) -> None:
        msg = "celery-leader: returning %s (%s) to queue %r: this process does not lead %r"
        where = (self.thread.queue_name, self.election)
        logger.info(msg, message.actor_name, message.message_id, *where)
        with self._lock:
            self._dirty = True
        # Redis takes it back now; RabbitMQ's requeue does nothing, its close does.
        self.thread.requeue_messages([message])

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
