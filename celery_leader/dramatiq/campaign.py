"""A Dramatiq worker process's part in the elections of the leader-only actors it consumes.

Only worker processes that consume a leader-only actor's queue campaign, each
with its own lease (instance id ``host:pid``). Leases are released at the first
SIGTERM or SIGHUP, in ``before_worker_shutdown`` and, because ``atexit`` does
not run in Dramatiq's worker processes, by a ``multiprocessing.util.Finalize``
too: a second SIGTERM (Dramatiq's main process relays the one systemd sends to
the whole group) skips the shutdown hooks but not the finalizers.
With ``leader_health_port`` set, the first worker process that campaigns serves
it and the others skip it (:mod:`.health_port`); with ``scheduler=True`` the
scheduler's fork process serves it instead: its tick is what a probe must watch.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from multiprocessing.util import Finalize
from typing import TYPE_CHECKING, Any

from dramatiq.common import q_name
from dramatiq.middleware import Middleware
from dramatiq.worker import CONSUMER_RESTART_DELAY_SECS

from .. import metrics
from ..config import LeaderConfig
from ..exceptions import LeaderError
from ..health import ConsumerLiveness
from ..lease import Lease
from ..leases import LeaseSet, Membership, lease_set
from ..pins import role_of
from ..process import after_fork_in_child
from .cli_errors import one_line_errors
from .gate import Gates
from .health_port import ElectionProbe
from .pika_logs import quiet_connect_errors

if TYPE_CHECKING:
    from .middleware import ActorRules


class Campaign(Middleware):
    """Joins this worker process's elections at boot, leaves them at shutdown, signal or exit."""

    def __init__(
        self,
        process_config: Callable[[], LeaderConfig],
        probe_port: int | None,
        rules: ActorRules,
        gates: Gates,
        reach: BrokerReach,
    ) -> None:
        self._process_config = process_config  # the store and instance id of this process
        self._probe_port = probe_port  # leader_health_port, if worker processes serve it
        self._rules = rules
        self._gates = gates  # told of every change of leadership
        self._reach = reach  # a process cut off from the broker must not lead
        self._booted = False  # a Worker of this process booted
        self._forget_parent()
        after_fork_in_child(self._forget_parent)

    def _forget_parent(self) -> None:
        """Start afresh: also in a process forked from the one that built the middleware
        (a parent's thread may have held the locks at the fork)."""
        self._lock = threading.Lock()
        self._stop_lock = threading.Lock()  # a second stop() waits for the first one
        self._leases: LeaseSet | None = None  # this process's, once it used the store
        self._memberships: dict[str, Membership] = {}  # election -> this campaign's share
        #: stop() ran: never join an election again in this process.
        self.closed = False
        self._campaigns: set[str] = set()  # elections this worker process consumes work of

    def after_process_boot(self, broker: Any) -> None:
        """Release at the first SIGTERM or SIGHUP.

        The release runs before Dramatiq's own handler, because Dramatiq's worker
        process only notices a SIGTERM at its next one-second poll; and when the
        signal reaches the whole group, Dramatiq's relayed copy often merges with
        it, so no second signal hurries it along.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.getsignal(sig)
            if callable(previous):
                signal.signal(sig, self._releasing(previous))

    def _releasing(self, previous: Callable[[int, Any], Any]) -> Callable[[int, Any], Any]:
        def handler(signum: int, frame: Any) -> Any:
            # The release talks to the store: not in a signal handler.
            threading.Thread(target=self.stop, name="celery-leader:release", daemon=True).start()
            return previous(signum, frame)

        return handler

    @one_line_errors
    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        """Campaign in the elections of the leader-only actors this process consumes."""
        if self._booted:
            # An earlier Worker of this process stopped (only tests start one
            # after another): this one may lead again. A process whose first
            # worker boots after a SIGTERM stays closed.
            with self._lock:
                self.closed = False
        self._booted = True
        with self._lock:
            self._campaigns = self._rules.elections(worker.consumers)
        for election in sorted(self._campaigns):
            self.lease(election)
        self._gates.update_all()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        """Hand over at once, before in-flight messages finish."""
        self.stop()

    def leads(self, election: str) -> bool:
        """Whether this process leads ``election`` now: a test's pin, else its own lease."""
        pin = role_of(election)
        if pin is not None:
            return pin.leads
        membership = self._memberships.get(election)
        return not self.closed and membership is not None and membership.lease.is_leader()

    def epoch(self, election: str) -> int | None:
        """The epoch this process leads ``election`` under now, else ``None`` (as :meth:`leads`)."""
        pin = role_of(election)
        if pin is not None:
            return pin.epoch
        membership = self._memberships.get(election)
        return None if self.closed or membership is None else membership.lease.epoch

    def lease(self, election: str | None = None) -> Lease:
        """This process's lease of ``election`` (default: the worker election).

        Only for an election this worker process campaigns in (see
        :meth:`campaigns`); the lease starts on first use.
        """
        election = election or self._rules.worker_election
        with self._lock:
            if self.closed:
                raise LeaderError("LeaderMiddleware stopped: this process is shutting down")
            if election not in self._campaigns:
                raise LeaderError(f"this process does not campaign in {election!r}")
            membership = self._memberships.get(election)
            if membership is None:
                port = self._probe_port
                probe = None if port is None else ElectionProbe(port)
                membership = self._memberships[election] = self._lease_set().join(
                    election,
                    callbacks=None if probe is None else probe.callbacks,
                    on_change=lambda lease: self._gates.update(lease.election),
                    health_check=lambda: self._reach.problem(election),
                    on_cycle=None if probe is None else probe.cycle,
                    observers=(metrics.OBSERVER,),
                    start=False,
                )
                if probe is not None:
                    # Before the lease starts, so its first cycle finds the record.
                    probe.offer(membership.lease)
                membership.lease.start()
        return membership.lease

    def campaigns(self, election: str | None = None) -> bool:
        """Whether this process campaigns in ``election``: a worker consuming its actors."""
        with self._lock:
            return (election or self._rules.worker_election) in self._campaigns

    def _lease_set(self) -> LeaseSet:
        """This process's leases and store connection (call with ``_lock`` held)."""
        if self._leases is None:
            self._leases = lease_set(self._process_config())
            Finalize(self, self.stop, exitpriority=100)
        return self._leases

    def stop(self) -> None:
        """Leave every election of this process (demote, release, wake a follower).

        Callers racing it (a signal's release thread, the shutdown hook, the
        finalizer at exit) wait until the first one has released.
        """
        with self._stop_lock:
            with self._lock:
                self.closed = True
                leases, self._leases = self._leases, None
                memberships, self._memberships = list(self._memberships.values()), {}
            if leases is None:
                return
            # Before the demotion below settles them (see Gate.shut_down).
            self._gates.shut_down()
            # Leaving the set's last lease closes its store connection.
            for membership in memberships:
                membership.leave()


class BrokerReach(Middleware):
    """Whether this process reaches the broker: one cut off from it must not lead.

    The consumer of each leader-only queue's delay queue runs on every
    process, leader or not, and Dramatiq's consumer loop calls its
    ``handle_delayed_messages`` after every message and every idle poll (at
    most ``worker_timeout`` apart). A consumer whose connection failed sits in
    Dramatiq's restart delay instead, retrying, and so falls silent.
    """

    def __init__(self, rules: ActorRules) -> None:
        self._rules = rules
        self._forget_parent()
        after_fork_in_child(self._forget_parent)

    def _forget_parent(self) -> None:
        # Also in a forked child: none of its parent's consumer threads run there.
        self._lock = threading.Lock()
        self._liveness: dict[str, list[ConsumerLiveness]] = {}  # election -> its consumers'

    def after_process_boot(self, broker: Any) -> None:
        """pika's failed connection attempts are said once, by whoever catches the error."""
        quiet_connect_errors(broker)

    def after_consumer_thread_boot(self, broker: Any, thread: Any) -> None:
        """Watch the consumer of a leader-only queue's delay queue."""
        queue = thread.queue_name
        election = self._rules.of_queue(queue).election
        if election is None or queue == q_name(queue):
            return
        grace = CONSUMER_RESTART_DELAY_SECS + 2 * thread.worker_timeout / 1000
        found = ConsumerLiveness(f"consumer of {queue!r}", grace)
        original = thread.handle_delayed_messages

        def handle_delayed_messages() -> None:
            found.alive()
            original()

        thread.handle_delayed_messages = handle_delayed_messages
        with self._lock:
            self._liveness.setdefault(election, []).append(found)

    def problem(self, election: str) -> str | None:
        """Why this process must not lead ``election``: its consumers cannot reach the broker."""
        for consumer in list(self._liveness.get(election, [])):
            problem = consumer.problem()
            if problem is not None:
                return problem
        return None
