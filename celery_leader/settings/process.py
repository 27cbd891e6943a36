"""This process: its default instance id, and what a forked child must forget."""

from __future__ import annotations

import os
import socket
import weakref
from collections.abc import Callable
from typing import Any


def default_instance_id(node: str | None = None) -> str:
    """``<node>:<pid>``: the instance id when none is configured (``node``: a Celery worker's
    ``name@host``, else the host name)."""
    return f"{node or socket.gethostname()}:{os.getpid()}"


def after_fork_in_child(forget: Callable[[], Any]) -> None:
    """Run ``forget`` in a forked child before it runs anything else: the parent's
    threads (leases) do not exist there. A bound method is held weakly."""
    if hasattr(forget, "__self__"):
        method = weakref.WeakMethod(forget)

        def call() -> None:
            bound = method()
            if bound is not None:
                bound()

        os.register_at_fork(after_in_child=call)
    else:
        os.register_at_fork(after_in_child=forget)
