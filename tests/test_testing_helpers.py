"""The test helpers users get (issue 22): pins, the pytest plugin, ``beat_replicas``, the docs.

docs/testing.md shows two complete example projects, ``tests/projects/celery_user``
and ``tests/projects/dramatiq_user``: every code block whose first line names a file
of one is that file, verbatim. The blocks are extracted and run with pytest in a
subprocess; the slow tests run the projects in clean virtualenvs that hold only
the package with one extra, and pytest.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
from celery import Celery
from dramatiq import worker as dramatiq_worker
from dramatiq.brokers.stub import StubBroker

from celery_leader import NotLeader, current_epoch, ensure_leader, is_leader, leader_only
from celery_leader.celery import leadership
from celery_leader.dramatiq import LeaderMiddleware
from celery_leader.dramatiq import current_epoch as dramatiq_epoch
from celery_leader.election.lease import Lease
from celery_leader.election.pins import as_follower, as_leader, reset
from celery_leader.testing import beat_replicas
from harness.venvs import clean_venv
from harness.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "testing.md"
PROJECTS = REPO / "tests" / "projects"
#: A fenced Python block whose first line is ``# <project>/<file>``.
BLOCK = re.compile(r"^```python\n(# ([\w]+)/([\w./]+)\n.*?)^```$", re.S | re.M)


def _docs_files() -> dict[str, str]:
    """``project/file`` -> the block's text, for every file block of docs/testing.md."""
    found: dict[str, str] = {}
    for text, project, name in BLOCK.findall(DOCS.read_text()):
        key = f"{project}/{name}"
        assert key not in found, f"docs/testing.md shows {key} twice"
        found[key] = text
    return found


def _extract(project: str, into: Path) -> Path:
    folder = into / project
    folder.mkdir(parents=True)
    for key, text in _docs_files().items():
        if key.startswith(project + "/"):
            (folder / key.partition("/")[2]).write_text(text)
    return folder


def _run_pytest(python: str, folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


# -- the docs and the example projects ------------------------------------------


def test_the_docs_show_the_example_projects_verbatim() -> None:
    on_disk = {
        str(path.relative_to(PROJECTS)): path.read_text()
        for path in PROJECTS.rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert _docs_files() == on_disk


@pytest.mark.parametrize("project", ["celery_user", "dramatiq_user"])
def test_the_docs_examples_pass(project: str, tmp_path: Path) -> None:
    result = _run_pytest(sys.executable, _extract(project, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b\d+ passed\b", result.stdout), result.stdout
    assert "failed" not in result.stdout, result.stdout


def test_the_plugin_is_opt_in() -> None:
    """No ``pytest11`` entry point: installing celery-leader changes nobody's test run."""
    plugins = importlib.metadata.entry_points(group="pytest11")
    assert not [ep for ep in plugins if ep.value.startswith("celery_leader")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("project", "extra", "absent"),
    [("celery_user", "celery", "dramatiq"), ("dramatiq_user", "dramatiq", "celery")],
)
def test_an_example_project_passes_in_a_clean_venv(
    project: str, extra: str, absent: str, tmp_path: Path
) -> None:
    """Only ``celery-leader[<extra>]`` and pytest installed, as the docs page says."""
    python, names = clean_venv(tmp_path, f"{REPO}[{extra}]", "pytest")
    assert absent not in names and "pytest-celery" not in names, names
    # A copy: inside this repository pytest would pick up its conftest.py and settings.
    folder = shutil.copytree(
        PROJECTS / project, tmp_path / project, ignore=shutil.ignore_patterns("__pycache__")
    )
    result = _run_pytest(python, folder)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b\d+ passed\b", result.stdout), result.stdout


# -- pins, in this process --------------------------------------------------------


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("pin_tests", broker="memory://", backend="cache+memory://")
    app.conf.leader_url = f"memory://{uuid.uuid4().hex}"
    app.conf.task_always_eager = True
    app.set_current()
    yield app
    reset()


def test_the_innermost_pin_wins_and_epochs_grow(app: Celery) -> None:
    with as_leader() as first:
        assert is_leader() and is_leader("reports") and current_epoch() == first
        with as_follower("reports"):
            assert is_leader() and not is_leader("reports")
            assert current_epoch("reports") is None
            with pytest.raises(NotLeader):
                ensure_leader("reports")
            with as_leader("reports", epoch=40):
                assert current_epoch("reports") == 40
            assert not is_leader("reports")
    with as_leader() as second:
        assert second > first


def test_a_pinned_follower_does_not_join_the_election(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.conf.leader_url = "redis://127.0.0.1:1/0"  # nothing listens: a lease would stall
    joined: list[str] = []
    monkeypatch.setattr(Lease, "start", lambda lease: joined.append(lease.election))

    @leader_only
    def job() -> str:  # a plain function: unpinned, its first call joins the election
        return "ran"

    with as_follower():
        assert not is_leader()
        assert job() is None
    assert joined == []


def test_the_body_runs_only_under_a_leader_pin(app: Celery) -> None:
    @app.task(shared=False)
    @leader_only
    def job() -> int | None:
        return current_epoch()

    with as_leader(epoch=12):
        assert job.delay().get() == 12
    with as_follower():
        assert job.delay().get() is None


def test_decorated_pins_and_bad_epochs(app: Celery) -> None:
    @as_follower()
    def check() -> bool:
        return is_leader()

    with as_leader():
        assert check() is False
        assert is_leader()
    with pytest.raises(ValueError, match="epoch must be an integer >= 1"):
        with as_leader(epoch=0):
            pass


def test_reset_reads_the_settings_afresh(app: Celery) -> None:
    @leader_only
    def job() -> str:
        return "ran"

    assert job() == "ran" and is_leader()  # joins the election on the first store
    first = leadership.config_of(app).url
    app.conf.leader_url = f"memory://{uuid.uuid4().hex}"
    reset()
    assert not is_leader()  # reset left the election: nothing to answer from
    assert leadership.config_of(app).url != first
    assert job() == "ran" and is_leader()


# -- beat_replicas ----------------------------------------------------------------


def test_beat_replicas_refuse_a_store_private_to_each_process(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="memory:// store is private to one process"):
        with beat_replicas("proj", leader_url="memory://", workdir=tmp_path):
            pass


@pytest.mark.slow
def test_beat_replicas_send_each_slot_once_across_a_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three real beat replicas; the one sending is killed; no slot is sent twice."""
    monkeypatch.syspath_prepend(str(PROJECTS / "celery_user"))
    settings = {
        "leader_ttl": 2,
        "beat_schedule": {"refresh-prices": {"task": "proj.refresh_prices", "schedule": 0.2}},
    }
    with beat_replicas(
        "proj", 3, leader_url=f"file://{tmp_path}/leases", workdir=tmp_path, settings=settings
    ) as beats:

        def sender() -> str | None:
            return next((name for name, slots in beats.sent().items() if slots), None)

        first = wait_for(sender, 30, message="a replica sends")
        beats.procs[first].send_signal(signal.SIGKILL)
        beats.procs[first].wait()
        killed_sent = len(beats.sent()[first])
        wait_for(
            lambda: any(slots for name, slots in beats.sent().items() if name != first),
            30,
            message="another replica took over",
        )
        time.sleep(1)
    sent = beats.sent()
    assert len(sent[first]) == killed_sent
    slots = [slot for by_replica in sent.values() for slot in by_replica]
    assert all(slot.startswith("refresh-prices@") for slot in slots)
    assert max(Counter(slots).values()) == 1, Counter(slots).most_common(3)
    assert len([name for name, by_replica in sent.items() if by_replica]) == 2


def test_a_dramatiq_wait_queue_follows_the_lease_again_when_the_pin_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dramatiq_worker, "CONSUMER_RESTART_DELAY_SECS", 0.05)
    broker = StubBroker()
    middleware = LeaderMiddleware(url=f"memory://{uuid.uuid4().hex}")
    broker.add_middleware(middleware)
    dramatiq.set_broker(broker)
    ran: list[int | None] = []

    @dramatiq.actor(queue_name="pinned-wait", leader_only=True, leader_on_follower="wait")
    def job() -> None:
        ran.append(dramatiq_epoch())

    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        with as_follower():
            job.send()
            time.sleep(0.3)
            assert ran == []
        # No pin: this process's own lease (the only one on its store) leads.
        broker.join("pinned-wait", timeout=10_000)
        worker.join()
        assert ran == [middleware.campaign.lease().epoch]
    finally:
        worker.stop()
        middleware.campaign.stop()
        broker.close()
