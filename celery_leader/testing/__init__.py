"""Test helpers for code that uses celery-leader: a pytest plugin, opt-in.

Load it from the root ``conftest.py`` of your project::

    pytest_plugins = ("celery_leader.testing",)

Not a ``pytest11`` entry point on purpose: that would load its autouse fixture into
the test run of every project that merely has celery-leader installed (Celery ships
``celery.contrib.pytest`` opt-in for the same reason). See docs/testing.md.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import pytest

from ..election.pins import as_follower, as_leader, reset
from .replicas import BeatReplicas, beat_replicas

__all__ = ["BeatReplicas", "as_follower", "as_leader", "beat_replicas"]

#: Marker name -> the context manager it enters for the test.
_MARKERS: dict[str, Callable[..., AbstractContextManager[Any]]] = {
    "leader": as_leader,
    "follower": as_follower,
}


def pytest_configure(config: pytest.Config) -> None:
    """Declare the markers, so that ``--strict-markers`` accepts them."""
    config.addinivalue_line(
        "markers",
        "leader(election=None, *, epoch=None): this process leads the election "
        "(default: every election) during the test (celery_leader.testing.as_leader)",
    )
    config.addinivalue_line(
        "markers",
        "follower(election=None): this process does not lead the election "
        "(default: any election) during the test (celery_leader.testing.as_follower)",
    )


@pytest.fixture
def leader_url() -> str:
    """A ``memory://`` lease store of this test alone: set it as the app's ``leader_url``."""
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture(autouse=True)
def _celery_leader_roles(request: pytest.FixtureRequest) -> Iterator[None]:
    # Autouse, so the pins are in place before the test's other fixtures start
    # a worker, and end after they stopped it.
    with ExitStack() as stack:
        # iter_markers() gives the closest first; enter it last, so it wins.
        for marker in reversed(list(request.node.iter_markers())):
            pin = _MARKERS.get(marker.name)
            if pin is not None:
                stack.enter_context(pin(*marker.args, **marker.kwargs))
        yield
    reset()
