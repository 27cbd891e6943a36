"""``@leader_only`` and ``is_leader`` in one process: bad input, plain functions, nesting.

The in-memory store keeps these fast; every test gets its own store (a unique
``memory://`` URL), and a second :class:`Lease` on the same store plays "the
other node".
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_leader import (
    current_epoch,
    ensure_leader,
    is_leader,
    leader_of,
    leader_only,
    leader_queue,
)
from celery_leader.backends import open_store
from celery_leader.celery import leadership
from celery_leader.election.lease import Lease
from celery_leader.election.lease_set import lease_set
from celery_leader.exceptions import ConfigError, NotLeader
from celery_leader.settings.config import LeaderConfig
from harness.waiting import wait_for


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("decorator_tests", broker="memory://", backend="cache+memory://")
    app.conf.leader_url = f"memory://{uuid.uuid4().hex}"
    app.conf.leader_ttl = 2
    app.set_current()
    yield app
    leadership.stop_local_leases()


def rival(app: Celery, election: str) -> Lease:
    """Another instance that holds ``election`` before this process asks."""
    config = LeaderConfig.from_app(app)
    lease = Lease.from_config(election, config, open_store(config).lock)
    lease.start()
    wait_for(lease.is_leader, 2, message=f"rival leads {election!r}")
    return lease


# -- bad input fails at import time ------------------------------------------


def test_misspelled_on_follower_names_the_choices_and_a_guess() -> None:
    with pytest.raises(ConfigError, match=r"on_follower must be one of .*did you mean 'retry'"):

        @leader_only(on_follower="retyr")  # type: ignore[arg-type]
        def f() -> None: ...


@pytest.mark.parametrize("name", ["", "has space", "{braces}"])
def test_bad_election_name(name: str) -> None:
    with pytest.raises(ConfigError, match="election must be a non-empty string"):
        leader_only(election=name)


def test_on_a_class() -> None:
    with pytest.raises(TypeError, match="decorates functions, not classes"):

        @leader_only
        class Job:
            pass


def test_on_a_class_with_arguments() -> None:
    with pytest.raises(TypeError, match="not classes"):

        @leader_only(election="reports")
        class Job:
            pass


def test_above_a_lazy_task_says_to_put_it_below(app: Celery) -> None:
    with pytest.raises(TypeError, match=r"put it below\s+@app.task"):

        @leader_only
        @app.task(shared=False)
        def job() -> None: ...


def test_above_a_finalized_task(app: Celery) -> None:
    app.finalize()
    with pytest.raises(TypeError, match=r"is applied to the Celery task 'x\.job'"):

        @leader_only(on_follower="retry")
        @app.task(shared=False, name="x.job")
        def job() -> None: ...


def test_not_callable() -> None:
    with pytest.raises(TypeError, match="decorates functions"):
        leader_only(42)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_retries": 5}, "apply only to on_follower='retry'"),
        ({"on_follower": "reject", "retry_backoff": 2}, "apply only to on_follower='retry'"),
        ({"on_follower": "retry", "max_retries": -1}, "max_retries must be None"),
        ({"on_follower": "retry", "max_retries": True}, "max_retries must be None"),
        ({"on_follower": "retry", "retry_backoff": 0}, "retry_backoff must be a number"),
        ({"on_follower": "retry", "retry_backoff_max": -1}, "retry_backoff_max must be"),
    ],
)
def test_bad_retry_options(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        leader_only(**kwargs)  # type: ignore[call-overload]


def test_keeps_name_and_doc() -> None:
    @leader_only
    def nightly() -> None:
        """Docs."""

    assert nightly.__name__ == "nightly"
    assert nightly.__doc__ == "Docs."
    assert nightly.__leader_only__.on_follower == "wait"  # type: ignore[attr-defined]


# -- plain functions: join lazily, a follower's call returns None ------------


def test_is_leader_outside_a_worker_never_joins(app: Celery) -> None:
    config = leadership.config_of(app)
    assert not is_leader() and current_epoch() is None
    with pytest.raises(NotLeader):
        ensure_leader()
    assert lease_set(config).elections() == []  # it joined nothing
    assert leader_of(config) is None  # and nobody campaigns: the store has no holder

    @leader_only
    def job() -> str:
        return "ran"

    # The "no lease" answer was not kept: once this process joins, it answers from the lease.
    assert job() == "ran"
    holder = leader_of(config)
    assert holder is not None and holder.instance_id == config.instance_id
    assert is_leader() and current_epoch() == holder.epoch


def test_plain_function_runs_on_the_leader(app: Celery) -> None:
    calls = []

    @leader_only
    def job(x: int) -> int:
        calls.append(x)
        return x * 2

    assert job(21) == 42  # the first call joins and waits for the outcome
    assert calls == [21]
    assert is_leader()
    assert is_leader("worker", app=app)


def test_plain_function_on_a_follower_returns_none(app: Celery) -> None:
    other = rival(app, "reports")
    calls = []

    @leader_only(election="reports", on_follower="retry")
    def job() -> str:
        calls.append(1)
        return "ran"

    assert job() is None
    assert calls == []
    assert not is_leader("reports")

    other.stop()  # released: this process takes over without waiting for the ttl
    wait_for(lambda: is_leader("reports"), 2, message="took over after the release")
    assert job() == "ran"


def test_default_election_follows_the_setting(app: Celery) -> None:
    app.conf.leader_worker_election = "crons"
    other = rival(app, "crons")

    @leader_only
    def job() -> str:
        return "ran"

    assert job() is None
    # The job joined the setting's election, not "worker".
    assert lease_set(leadership.config_of(app)).elections() == ["crons"]
    other.stop()


def test_task_called_directly_behaves_like_a_plain_function(app: Celery) -> None:
    other = rival(app, "worker")

    @app.task(shared=False)
    @leader_only(on_follower="retry")
    def job() -> str:
        return "ran"

    # Neither a direct call nor an eager apply is a worker run: no retry loop.
    assert job() is None
    assert job.apply().get() is None
    other.stop()
    wait_for(is_leader, 2, message="took over")
    assert job() == "ran"


def test_bad_settings_fail_on_first_use_naming_the_setting(app: Celery) -> None:
    app.conf.leader_ttl = -1

    @leader_only
    def job() -> None: ...

    with pytest.raises(ConfigError, match="leader_ttl"):
        job()


# -- long bodies: current_epoch and ensure_leader -----------------------------


def test_current_epoch_and_ensure_leader_follow_the_term(app: Celery) -> None:
    @leader_only
    def job() -> int | None:
        return current_epoch()

    @leader_only(election="reports")
    def report() -> str:
        return "ran"

    epoch = job()  # joins the election, which nobody else holds
    assert isinstance(epoch, int)
    ensure_leader()
    other = rival(app, "reports")
    assert report() is None  # joins "reports" as a follower
    assert current_epoch("reports") is None
    with pytest.raises(NotLeader, match="does not lead 'reports'"):
        ensure_leader("reports")
    rival_epoch = other.epoch
    assert rival_epoch is not None
    other.stop()
    mine = wait_for(lambda: current_epoch("reports"), 2, message="took over after the release")
    assert mine > rival_epoch  # a later term, a larger fencing token


class _ResignsAfterTheCheck:
    """A lease's clock: the read after the leadership check's, in the checking thread,
    first makes the lease resign (``leader resign``, a step-down)."""

    def __init__(self, lease: Lease) -> None:
        self.lease, self.real = lease, lease.clock
        self.thread = threading.current_thread()
        self.reads = 0

    def monotonic(self) -> float:
        if threading.current_thread() is self.thread:
            self.reads += 1
            if self.reads == 2:
                self.lease.step_down("leader resign", sit_out=60)
        return self.real.monotonic()

    def time(self) -> float:
        return self.real.time()

    def wait(self, timeout: float, *events: threading.Event) -> bool:
        return self.real.wait(timeout, *events)


def test_a_body_let_through_while_leading_runs_with_that_epoch_after_a_resign(
    app: Celery,
) -> None:
    seen: list[tuple[int | None, bool, bool]] = []

    @leader_only
    def job() -> None:
        # The body's first line: the lease resigned after the check let it in.
        try:
            ensure_leader()
            ensured = True
        except NotLeader:
            ensured = False
        seen.append((current_epoch(), is_leader(), ensured))

    assert current_epoch() is None
    job()  # joins the election, which nobody else holds
    epoch = current_epoch()
    assert epoch is not None and seen == [(epoch, True, True)]
    lease = lease_set(leadership.config_of(app)).lease_of("worker")
    assert lease is not None
    lease.clock = _ResignsAfterTheCheck(lease)
    job()
    # It runs with the epoch it passed with; is_leader() and ensure_leader() tell
    # the truth about now.
    assert seen[1:] == [(epoch, False, False)]
    assert current_epoch() is None, "the body's epoch outlived the body"


# -- routing: wait-mode tasks go to their leader queue -------------------------


def test_wait_mode_tasks_are_routed_to_their_leader_queue(app: Celery) -> None:
    @app.task(shared=False)
    @leader_only(election="reports")
    def job() -> None: ...

    @app.task(shared=False)
    @leader_only(on_follower="skip")
    def broadcast() -> None: ...

    @app.task(shared=False)
    def plain() -> None: ...

    router = app.amqp.router  # the app is configured only now, after the decorator
    assert leader_queue("reports", app=app) == "celery_leader.leader.reports"
    assert router.route({}, job.name, task_type=job)["queue"].name == "celery_leader.leader.reports"
    for other in (broadcast, plain):
        assert router.route({}, other.name, task_type=other)["queue"].name == "celery"
    # An explicit queue still wins, as for any Celery router.
    assert router.route({"queue": "x"}, job.name, task_type=job)["queue"].name == "x"
