"""The worker bootsteps with Celery's in-process worker (solo pool, memory broker).

Fast checks of what needs a worker but not separate processes: how a follower
treats a task (skip, retry without limit, give up loudly, reject), automatic
installation, signals, release on stop, and fencing. The real multi-process
behaviour is in ``test_worker_processes.py``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery, current_task
from celery import signals as celery_signals
from celery.contrib.testing.worker import start_worker
from celery.exceptions import MaxRetriesExceededError
from celery.worker import state as worker_state

from celery_leader import signals
from celery_leader.backends import open_store
from celery_leader.celery import deadline_table, leadership
from celery_leader.celery.decorators import CONSUMER_STEPS, WORKER_STEP, leader_only
from celery_leader.celery.worker import FencedStrategies, LeaderNode, install
from celery_leader.election.lease import Lease
from celery_leader.settings.config import LeaderConfig
from harness.waiting import wait_for


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("step_tests", broker="memory://", backend="cache+memory://")
    app.conf.leader_url = f"memory://{uuid.uuid4().hex}"
    app.conf.leader_ttl = 2
    # The memory transport polls; its default of 1 s would dominate every test.
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    yield app
    leadership.stop_local_leases()


def rival(app: Celery, election: str = "worker", instance_id: str = "rival") -> Lease:
    config = LeaderConfig.from_mapping(
        {"leader_url": app.conf.leader_url, "leader_ttl": 2, "leader_instance_id": instance_id}
    )
    lease = Lease.from_config(election, config, open_store(config).lock)
    lease.start()
    wait_for(lease.is_leader, 2, message=f"{instance_id} leads {election!r}")
    return lease


def waiting(app: Celery, queue: str) -> int:
    """Messages in ``queue`` of the memory broker (none of them delivered)."""
    with app.connection_for_write() as conn:
        return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)


@contextmanager
def worker(app: Celery) -> Iterator[Any]:
    """Celery's in-process worker (solo pool), stopped without its 2 s idle wait.

    Starting it sets up Celery's logging (the root logger's level becomes ERROR):
    the root logger is put back afterwards, or later tests in this process would
    see no INFO or WARNING record in ``caplog``.
    """
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30) as w:
            try:
                yield w
            finally:
                # The consumer waits up to 2 s for a message before it checks
                # should_terminate, and once more after: two messages end both waits.
                worker_state.should_terminate = 0
                app.send_task("wake-up")
                app.send_task("wake-up")
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers


def test_step_is_added_by_the_decorator_alone(app: Celery) -> None:
    @app.task(shared=False)
    @leader_only
    def job() -> str:
        return "ran"

    with worker(app) as w:
        assert WORKER_STEP in app.steps["worker"]
        assert set(CONSUMER_STEPS) <= app.steps["consumer"]
        assert job.delay().get(timeout=10) == "ran"
        assert w.leader_node.leases[0].is_leader()


def test_workers_of_other_apps_are_left_alone(app: Celery) -> None:
    @leader_only
    def helper() -> None: ...

    @app.task(shared=False)
    def job() -> str:
        return "ran"

    with worker(app) as w:
        assert job.delay().get(timeout=10) == "ran"
        assert WORKER_STEP not in app.steps["worker"]
        assert not hasattr(w, "leader_node")


def test_install_is_idempotent(app: Celery) -> None:
    install(app)
    install(app)
    assert app.steps["worker"] == {WORKER_STEP}
    assert app.steps["consumer"] == set(CONSUMER_STEPS)


def test_joins_the_default_and_every_named_election(app: Celery) -> None:
    @app.task(shared=False)
    @leader_only(election="reports-x")
    def report() -> None: ...

    @leader_only(election="plain-x")
    def helper() -> None: ...

    app.conf.leader_worker_election = "main-x"
    with worker(app) as w:
        names = {lease.election for lease in w.leader_node.leases}
        assert {"main-x", "reports-x", "plain-x"} <= names
        assert w.leader_node.table.names == sorted(names)
        # The node name, which operators know, and the pid, which tells apart
        # two nodes started with the same -n by mistake.
        assert w.leader_node.leases[0].instance_id == f"{w.hostname}:{os.getpid()}"


def test_skip_drops_the_task(app: Celery) -> None:
    other = rival(app)
    states: list[str] = []

    @app.task(shared=False)
    @leader_only(on_follower="skip")
    def job() -> str:
        return "ran"

    def postrun(state: str = "", **_: Any) -> None:
        states.append(state)

    celery_signals.task_postrun.connect(postrun, weak=False)
    try:
        with worker(app):
            result = job.delay()
            wait_for(lambda: states, 10, message="task finished")
            assert states == ["IGNORED"]
            assert result.state == "PENDING"  # Ignore stores nothing
    finally:
        celery_signals.task_postrun.disconnect(postrun)
        other.stop()


def test_wait_holds_the_task_until_this_node_leads(app: Celery) -> None:
    other = rival(app)
    runs: list[str] = []

    @app.task(shared=False)
    @leader_only
    def job() -> str:
        runs.append(current_task.request.delivery_info["routing_key"])
        return "ran"

    @app.task(shared=False)
    def later() -> str:
        return "polled"

    with worker(app) as w:
        result = job.delay()
        # The worker has polled the broker since (a task sent after it ran), and the
        # message still waits in the leader queue: a follower does not even receive it.
        assert later.delay().get(timeout=10) == "polled"
        assert waiting(app, "celery_leader.leader.worker") == 1
        assert runs == []
        assert not w.consumer.task_consumer.consuming_from("celery_leader.leader.worker")
        other.stop()  # this node is elected, consumes the leader queue, runs it
        assert result.get(timeout=10) == "ran"
    assert runs == ["celery_leader.leader.worker"]


def test_retry_goes_on_past_celerys_default_of_three(app: Celery) -> None:
    other = rival(app)
    retries: list[int] = []

    @app.task(shared=False)
    @leader_only(on_follower="retry", retry_backoff=0.02, retry_backoff_max=0.05)
    def job() -> int:
        return int(current_task.request.retries)

    def on_retry(request: Any = None, **_: Any) -> None:
        retries.append(request.retries)

    celery_signals.task_retry.connect(on_retry, weak=False)
    try:
        with worker(app):
            result = job.delay()
            wait_for(lambda: len(retries) > 5, 20, message="more than 5 retries")
            other.stop()  # now this worker takes over and runs it
            assert result.get(timeout=20) > 5
    finally:
        celery_signals.task_retry.disconnect(on_retry)


def test_bound_tasks_get_self_and_are_recognised(app: Celery) -> None:
    other = rival(app)

    @app.task(shared=False, bind=True)
    @leader_only(on_follower="retry", retry_backoff=0.01, retry_backoff_max=0.02)
    def job(self: Any, x: int) -> tuple[str, int]:
        return self.name, x

    with worker(app):
        result = job.delay(7)
        wait_for(lambda: result.state == "RETRY", 10, message="retried as a follower")
        other.stop()
        assert result.get(timeout=20) == [job.name, 7]


def test_retry_with_a_limit_gives_up_loudly(app: Celery) -> None:
    other = rival(app)

    @app.task(shared=False)
    @leader_only(on_follower="retry", retry_backoff=0.01, retry_backoff_max=0.02, max_retries=2)
    def job() -> str:
        return "ran"

    try:
        with worker(app):
            result = job.delay()
            with pytest.raises(MaxRetriesExceededError):
                result.get(timeout=20)
            assert result.state == "FAILURE"
    finally:
        other.stop()


def test_retry_does_not_leak_its_limit_into_the_task(app: Celery) -> None:
    other = rival(app)

    @app.task(shared=False)
    @leader_only(on_follower="retry", retry_backoff=0.01, retry_backoff_max=0.02)
    def job() -> int:
        return int(current_task.request.retries)

    try:
        with worker(app):
            result = job.delay()
            wait_for(lambda: result.state == "RETRY", 10, message="retried")
            other.stop()
            result.get(timeout=20)
            # autoretry_for would read it and retry the user's own errors forever.
            assert not hasattr(job, "override_max_retries")
    finally:
        other.stop()


def test_reject_requeues_until_the_leader_takes_it(app: Celery) -> None:
    other = rival(app)
    runs: list[str] = []

    @app.task(shared=False, acks_late=True)
    @leader_only(on_follower="reject")
    def job() -> str:
        runs.append(current_task.request.hostname)
        return "ran"

    events: list[tuple[str, str]] = []  # (task id, "started" or the state it ended in)

    def prerun(task_id: str = "", **_: Any) -> None:
        events.append((task_id, "started"))

    def postrun(task_id: str = "", state: str = "", **_: Any) -> None:
        events.append((task_id, state))

    def bounced(task_id: str) -> bool:
        """Held while the rival leads (up to 1 s), requeued, and delivered again."""
        return [e for i, e in events if i == task_id][:3] == ["started", "REJECTED", "started"]

    celery_signals.task_prerun.connect(prerun, weak=False)
    celery_signals.task_postrun.connect(postrun, weak=False)
    try:
        with worker(app):
            result = job.delay()
            wait_for(
                lambda: bounced(result.id),
                10,
                message=lambda: f"not requeued and delivered again: {events}",
            )
            assert runs == []
            other.stop()
            assert result.get(timeout=20) == "ran"
    finally:
        celery_signals.task_prerun.disconnect(prerun)
        celery_signals.task_postrun.disconnect(postrun)
    assert len(runs) == 1


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_reject_without_acks_late_warns_at_startup(app: Celery) -> None:
    @app.task(shared=False, name="no_ack_late")
    @leader_only(on_follower="reject")
    def job() -> None: ...

    # The in-process worker sets up Celery's logging (root handler replaced,
    # level ERROR): listen on the logger itself.
    records = _Records()
    logger = logging.getLogger("celery_leader.celery.worker")
    logger.addHandler(records)
    logger.setLevel(logging.WARNING)
    try:
        with worker(app):
            pass
    finally:
        logger.removeHandler(records)
        logger.setLevel(logging.NOTSET)
    expected = "task no_ack_late uses @leader_only(on_follower='reject') without acks_late"
    assert any(expected in m for m in records.messages)


def test_a_plain_function_inside_a_task_does_not_stop_the_task(app: Celery) -> None:
    other = rival(app, "helpers")

    @leader_only(election="helpers")
    def helper() -> str:
        return "helped"

    @app.task(shared=False)
    def job() -> tuple[str | None, str]:
        return helper(), "task ran"

    try:
        with worker(app):
            assert job.delay().get(timeout=10) == [None, "task ran"]
    finally:
        other.stop()


def test_signals_fire_and_stop_releases_at_once(app: Celery) -> None:
    events: list[tuple[str, str]] = []

    def elected(sender: str, **_: Any) -> None:
        events.append(("elected", sender))

    def demoted(sender: str, **_: Any) -> None:
        events.append(("demoted", sender))

    @app.task(shared=False)
    @leader_only
    def job() -> None: ...

    signals.elected.connect(elected, weak=False)
    signals.demoted.connect(demoted, weak=False)
    try:
        with worker(app) as w:
            wait_for(lambda: ("elected", "worker") in events, 5, message="elected")
            table = w.leader_node.table
            assert deadline_table.process_table() is table
        assert ("demoted", "worker") in events
        # Released, not left to expire: another instance takes over immediately.
        other = rival(app, instance_id="next")
        assert other.holder().instance_id == "next"  # type: ignore[union-attr]
        other.stop()
        assert not table.path.exists()
        assert deadline_table.process_table() is None
    finally:
        signals.elected.disconnect(elected)
        signals.demoted.disconnect(demoted)


# -- fencing -----------------------------------------------------------------


class _Message:
    def __init__(self, headers: dict[str, Any]) -> None:
        self.headers = headers


def test_fence_drops_older_epochs_and_learns_newer_ones(app: Celery) -> None:
    app.conf.leader_fence_tasks = True
    node = LeaderNode(LeaderConfig.from_app(app), ["worker"])
    try:
        seen: list[str] = []
        acked: list[str] = []
        strategies = FencedStrategies(node, ())
        strategies["t"] = lambda message, *args, **kw: seen.append(message.headers["id"])

        def deliver(id_: str, **headers: Any) -> None:
            strategies["t"](
                _Message({"id": id_, "task": "t", **headers}),
                None,
                lambda *a: acked.append(id_),
                None,
                None,
            )

        deliver("a", leader_epoch=3)
        deliver("b", leader_epoch=2)  # sent by a scheduler deposed before epoch 3
        deliver("c")  # not from beat: never fenced
        deliver("d", leader_epoch=3)
        deliver("e", leader_epoch="3")  # not an epoch we wrote: ignored
        # A retry, or a message the broker delivers again, of a slot that was
        # admitted before epoch 3 began: never dropped.
        deliver("f", leader_epoch=2, retries=1)
        deliver("g", leader_epoch=2, redelivered=True)
        assert seen == ["a", "c", "d", "e", "f", "g"]
        assert acked == ["b"]
    finally:
        node.stop()
        node.uninstall()


def test_fence_reads_the_current_epoch_from_the_store(app: Celery) -> None:
    app.conf.leader_fence_tasks = True
    first = rival(app, "beat", "beat-1")
    old = first.epoch
    first.stop()
    second = rival(app, "beat", "beat-2")
    current = second.epoch
    assert old is not None and current is not None and current > old
    node = LeaderNode(LeaderConfig.from_app(app), ["worker"])
    try:
        node.start()
        assert node.beat_epoch == current
        assert not node.admit(old)
        assert node.admit(current)
    finally:
        node.stop()
        node.uninstall()
        second.stop()


def test_fence_step_wraps_strategies_built_later(app: Celery) -> None:
    app.conf.leader_fence_tasks = True
    ran: list[str] = []

    @app.task(shared=False)
    def job(tag: str) -> None:
        ran.append(tag)

    install(app)  # no @leader_only task here to add the steps by itself
    with worker(app) as w:
        strategies = w.consumer.strategies
        assert isinstance(strategies, FencedStrategies)
        w.leader_node.admit(5)
        job.apply_async(("old",), headers={"leader_epoch": 4})
        job.apply_async(("new",), headers={"leader_epoch": 5})
        wait_for(lambda: ran == ["new"], 10, message="only the current epoch's task ran")
        w.consumer.update_strategies()  # a reload rebuilds them: still fenced
        assert all(s.__name__ == "fenced" for s in w.consumer.strategies.values())
