"""Worker bootsteps: the elections run in the main process, shared with the pool.

Importing :mod:`celery_leader.celery.decorators` adds them to a starting worker
whose app has a ``@leader_only`` task; :func:`install` adds them anyway.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..election.events import Callbacks
from ..election.lease import Lease
from ..election.lease_set import lease_set
from ..election.pins import role_of
from ..exceptions import StoreUnavailable, missing_extra
from ..probes import http as http_health
from ..probes import metrics
from ..probes.health import ConsumerLiveness, HealthFile
from ..settings.config import LeaderConfig
from ..settings.process import default_instance_id
from . import deadline_table, decorators, leadership, routing
from .routing import spec_of
from .signals import SIGNALS

try:
    from celery import bootsteps, signals
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

logger = logging.getLogger(__name__)

#: Longest gap between two publications of a renewed deadline. Pool processes
#: see the previous deadline meanwhile, which is earlier (never too late) and
#: still ``ttl - renew_interval`` away when the renewal lands.
MAX_PUBLISH_INTERVAL = 0.25

#: How often the consumer compares what it consumes with what the node leads.
#: A local clock compare, in the consumer's own thread (kombu connections are
#: not thread-safe): a new leader starts consuming its leader queue within this.
QUEUE_SYNC_INTERVAL = 0.1


def install_worker_steps(app: Any) -> None:
    """Add the celery-leader bootsteps to ``app``'s workers (before the worker builds
    its blueprint). Idempotent; ``@leader_only`` on a task does it by itself."""
    decorators.add_steps(app)


#: The name the first releases documented: the same function.
install = install_worker_steps


class LeaderNode:
    """The leases of one worker node and their deadline table (built before the pool
    starts, so that the table exists when pool processes fork or spawn)."""

    def __init__(
        self,
        config: LeaderConfig,
        elections: list[str],
        queues: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        #: Election -> leader queue, for the elections with ``wait``-mode tasks.
        self.queues = dict(queues or {})
        #: A node whose consumer is cut off for a ttl cannot consume a leader queue:
        #: it steps down and stays out until the consumer is back.
        self.consumer = ConsumerLiveness("the worker's broker consumer", config.ttl)
        self._lease_set = lease_set(config)
        self.table = deadline_table.DeadlineTable.create(
            deadline_table.store_id(config.url, config.key_prefix), elections
        )
        #: Who the worker election last saw lead, for the HTTP endpoint's ``/leader``.
        self.leader_seen = http_health.LeaderSeen()
        # A node with a leader queue must be able to consume it to lead.
        self._memberships = [
            self._lease_set.join(
                name,
                callbacks=(
                    Callbacks(on_new_leader=self.leader_seen)
                    if name == config.worker_election and config.health_port is not None
                    else None
                ),
                on_change=self._write_deadline,
                health_check=self.consumer.problem if name in self.queues else None,
                observers=(SIGNALS, metrics.OBSERVER),
                start=False,
            )
            for name in elections
        ]
        self.leases = [membership.lease for membership in self._memberships]
        self._write_lock = threading.Lock()
        self._leave_now = threading.Event()
        self._leave_lock = threading.Lock()
        self._left = False
        self._thread: threading.Thread | None = None
        self._beat_epoch = 0
        self._epoch_lock = threading.Lock()
        self._by_election = {lease.election: lease for lease in self.leases}
        if config.metrics_port is not None:
            metrics.require()  # a missing [metrics] extra fails as the worker starts
        #: The worker election's health (``leader check``, the HTTP endpoint); rewritten
        #: by the deadline loop, so a stuck loop shows as a stale file.
        self.health = (
            None
            if config.health_file is None and config.health_port is None
            else HealthFile(config.health_file, self._by_election[config.worker_election])
        )
        deadline_table.set_process_table(self.table)
        leadership.forget_views()

    def leads(self, election: str) -> bool:
        """True while this node leads ``election`` (no I/O); a test's pin wins."""
        pin = role_of(election)
        if pin is not None:
            return pin.leads
        return self._by_election[election].is_leader()

    def start(self) -> None:
        """Join every election and start writing their deadlines."""
        if self.config.fence_tasks:
            self._refresh_beat_epoch()
        if self.config.metrics_port is not None:
            metrics.serve(self.config.metrics_port)
        if self.config.health_port is not None and self.health is not None:
            http_health.serve(self.config.health_port, self.health, self.leader_seen)
        for lease in self.leases:
            metrics.track(lease)
            lease.start()
        self._thread = threading.Thread(target=self._run, name="celery-leader:table", daemon=True)
        self._thread.start()

    def request_leave(self) -> None:
        """Ask the deadline thread to leave every election now.

        Only sets an event: Celery runs ``worker_shutting_down`` receivers in a
        signal handler, up to a second before it stops the bootsteps.
        """
        self._leave_now.set()

    def leave(self) -> None:
        """Leave every election: demote, then release. Idempotent, any thread."""
        with self._leave_lock:
            if self._left:
                return
            self._leave_now.set()
            for membership in self._memberships:
                try:
                    membership.leave()
                except Exception:
                    logger.exception(
                        "celery-leader: could not leave election %r", membership.lease.election
                    )
            self._left = True

    def stop(self) -> None:
        """Leave every election, stop writing deadlines, remove the table file. Idempotent."""
        self.leave()
        if self._thread is not None:
            self._thread.join()
        for lease in self.leases:
            self.table.write(lease.election, 0.0, 0)
            metrics.untrack(lease)
        if self.health is not None:
            self.health.write()  # says "follower" from now on
        self.table.remove()

    def uninstall(self) -> None:
        """Stop serving this node's table to calls in this process.

        Done once the pool has stopped: until then, tasks still draining in the
        main process (threads pool) must read "not leading" here rather than join.
        """
        if deadline_table.process_table() is self.table:
            deadline_table.set_process_table(None)
            leadership.forget_views()

    def admit(self, epoch: int) -> bool:
        """Fencing: False for an epoch older than the beat election's current one."""
        with self._epoch_lock:
            if epoch < self._beat_epoch:
                return False
            self._beat_epoch = epoch
            return True

    @property
    def beat_epoch(self) -> int:
        """Highest epoch of the beat election this node has seen."""
        return self._beat_epoch

    def _write_deadline(self, lease: Lease) -> None:
        # Reading the lease under the lock orders a demotion against a
        # concurrent periodic write: whichever writes last read the lease
        # after it dropped its belief, so a stale deadline never lands after
        # the zero that precedes the release.
        with self._write_lock:
            self.table.write(lease.election, lease.valid_until, lease.epoch or 0)

    def _run(self) -> None:
        interval = min(self.config.renew_interval / 4, MAX_PUBLISH_INTERVAL)
        next_fence = 0.0
        while not self._leave_now.wait(interval):
            for lease in self.leases:
                self._write_deadline(lease)
            if self.health is not None:
                self.health.write(force=False)
            if self.config.fence_tasks:
                next_fence -= interval
                if next_fence <= 0:
                    self._refresh_beat_epoch()
                    next_fence = self.config.renew_interval
        self.leave()

    def _refresh_beat_epoch(self) -> None:
        try:
            holder = self._lease_set.store.lock.holder(self.config.beat_election)
        except StoreUnavailable as exc:
            logger.debug("celery-leader: could not read the beat epoch: %s", exc)
            return
        if holder is not None:
            with self._epoch_lock:
                self._beat_epoch = max(self._beat_epoch, holder.epoch)


class LeaderStep(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
    """Worker bootstep: joins the node's elections in the main process.

    It starts after the pool and so stops *before* it: on a warm shutdown the
    node releases its terms first and another takes over while this one drains.
    """

    label = "celery-leader"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, w: Any, **kwargs: Any) -> None:
        super().__init__(w, **kwargs)
        config = leadership.config_of(w.app)
        if w.app.conf.get("leader_instance_id") is None:
            # The node name (name@host) is what operators know workers by; the
            # pid tells apart two nodes started with the same -n by mistake.
            config = dataclasses.replace(config, instance_id=default_instance_id(w.hostname))
        elections = _elections(w.app, config)
        _warn_reject_without_acks_late(w.app)
        queues = routing.leader_queues(w.app, config.worker_election)
        self.node = LeaderNode(config, elections, queues)
        w.leader_node = self.node
        _nodes[w.hostname] = self.node
        logger.info(
            "celery-leader: %s joins %s (store %s)",
            config.instance_id,
            ", ".join(repr(e) for e in elections),
            config.display_url,
        )

    def create(self, w: Any) -> LeaderNode:
        """The service started and stopped with the worker."""
        return self.node

    def start(self, w: Any) -> None:
        """Declare the leader queues on the broker, then join the elections."""
        routing.declare_on_broker(w.app, self.node.queues.values())
        self.node.start()

    def stop(self, w: Any) -> None:
        """Warm shutdown: leave (if the shutdown signal did not already), before the pool drains."""
        self.node.stop()
        _nodes.pop(w.hostname, None)

    def terminate(self, w: Any) -> None:
        """Cold shutdown: leave at once too; the pool's tasks are killed, none drain."""
        self.stop(w)
        self.node.uninstall()


class LeaderQueueStep(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
    """Consumer bootstep: consume each leader queue while, and only while, the node leads.

    Messages prefetched from a leader queue before a demotion are not run here:
    the task body sees "not leading" and forwards them back to the leader queue.
    """

    label = "celery-leader queues"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.node: LeaderNode | None = getattr(c.controller, "leader_node", None)
        self._timer: Any = None

    def start(self, c: Any) -> None:
        """Start comparing leadership and consumption (the consumer is connected)."""
        if self.node is None or not self.node.queues or self._timer is not None:
            return
        self.node.consumer.connected()
        self._sync(c)
        self._timer = c.timer.call_repeatedly(QUEUE_SYNC_INTERVAL, self._sync, (c,))

    def stop(self, c: Any) -> None:
        """Stop the timer (the consumer cancels every queue itself); also on a lost
        broker connection, before the consumer reconnects and starts this again."""
        if self.node is not None:
            self.node.consumer.disconnected()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.node is not None:
            # add_task_queue() selected the queue in the app, which outlives
            # this consumer: a restarted consumer must not consume it before
            # _sync() says so, and a later worker of the app in this process
            # (tests) would refuse to start with it selected.
            c.app.amqp.queues.deselect(list(self.node.queues.values()))

    shutdown = stop

    def _sync(self, c: Any) -> None:
        node = self.node
        consumer = c.task_consumer
        if node is None or consumer is None:
            return
        for election, queue in node.queues.items():
            leads = node.leads(election)
            if leads == bool(consumer.consuming_from(queue)):
                continue
            if leads:
                logger.info(
                    "celery-leader: %s consumes %s: it leads %r",
                    node.config.instance_id,
                    queue,
                    election,
                )
                c.add_task_queue(queue)
            else:
                logger.info(
                    "celery-leader: %s stops consuming %s: it no longer leads %r",
                    node.config.instance_id,
                    queue,
                    election,
                )
                c.cancel_task_queue(queue)


class FenceStep(bootsteps.Step):  # type: ignore[misc]  # celery is untyped
    """Consumer bootstep (``leader_fence_tasks``): drops task messages sent under an older
    beat epoch, through the strategy table so that strategies rebuilt later are fenced too.

    Only a slot's first delivery is judged: a retry or a redelivered message comes
    from a delivery that was admitted, and dropping it now would lose the slot.
    """

    label = "celery-leader fence"

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        node: LeaderNode | None = getattr(c.controller, "leader_node", None)
        if node is None or not node.config.fence_tasks:
            return
        fenced = FencedStrategies(node, c.connection_errors)
        fenced.update(c.strategies)
        c.strategies = fenced


class FencedStrategies(dict[str, Callable[..., Any]]):
    """The consumer's task-name -> strategy table, fencing every strategy stored in it."""

    def __init__(self, node: LeaderNode, connection_errors: tuple[type[Exception], ...]) -> None:
        super().__init__()
        self._node = node
        self._connection_errors = connection_errors

    def __setitem__(self, name: str, strategy: Callable[..., Any]) -> None:
        super().__setitem__(name, self._wrap(strategy))

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Wrap each strategy, as item assignment does."""
        for name, strategy in dict(*args, **kwargs).items():
            self[name] = strategy

    def _wrap(self, strategy: Callable[..., Any]) -> Callable[..., Any]:
        node = self._node
        errors = self._connection_errors

        def fenced(
            message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any
        ) -> Any:
            headers = message.headers or {}
            epoch = headers.get("leader_epoch")
            if type(epoch) is int and _first_delivery(message, headers) and not node.admit(epoch):
                logger.warning(
                    "celery-leader: dropped task %s[%s]: sent under beat epoch %d, but epoch "
                    "%d has started since (a deposed scheduler sent it late)",
                    headers.get("task"),
                    headers.get("id"),
                    epoch,
                    node.beat_epoch,
                )
                ack(logger, errors)
                return None
            return strategy(message, body, ack, reject, callbacks, **kwargs)

        return fenced


def _first_delivery(message: Any, headers: Mapping[str, Any]) -> bool:
    """False for a retry of a task, or a message the broker delivers again."""
    retries = headers.get("retries")
    if type(retries) is int and retries > 0:
        return False
    info = getattr(message, "delivery_info", None) or {}
    return not (info.get("redelivered") or headers.get("redelivered"))


def _elections(app: Any, config: LeaderConfig) -> list[str]:
    names = {config.worker_election} | leadership.named_elections()
    for task in app.tasks.values():
        spec = spec_of(task)
        if spec is not None and spec.election is not None:
            names.add(spec.election)
    return sorted(names)


def _warn_reject_without_acks_late(app: Any) -> None:
    for task in app.tasks.values():
        spec = spec_of(task)
        if spec is not None and spec.on_follower == "reject" and not task.acks_late:
            logger.warning(
                "celery-leader: task %s uses @leader_only(on_follower='reject') without "
                "acks_late: a follower's reject cannot requeue a message that was "
                "acknowledged on receipt, so the task is lost. Declare it with "
                "@app.task(acks_late=True).",
                task.name,
            )


# hostname -> node of the workers running in this process, for the
# worker_shutting_down signal (whose sender is the hostname).
_nodes: dict[str, LeaderNode] = {}


def _on_shutting_down(sender: Any = None, **_: Any) -> None:
    """A shutdown signal arrived: hand over now, not when the event loop notices."""
    node = _nodes.get(sender)
    if node is not None:
        node.request_leave()


def _after_warm_shutdown(sender: Any = None, **_: Any) -> None:
    """``worker_shutdown``: the pool has drained, the table can go."""
    node: LeaderNode | None = getattr(sender, "leader_node", None)
    if node is not None:
        node.uninstall()


signals.worker_shutting_down.connect(
    _on_shutting_down, weak=False, dispatch_uid="celery_leader.worker_shutting_down"
)
signals.worker_shutdown.connect(
    _after_warm_shutdown, weak=False, dispatch_uid="celery_leader.worker_shutdown"
)
