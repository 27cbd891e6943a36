"""This process: its default instance id, and what a forked child must forget.

One place for both, so that every part of the package (config, the Celery worker
step, the Dramatiq middleware) names a process the same way and starts afresh in
a forked child the same way.
"""

from __future__ import annotations

import os
import socket
import weakref
from collections.abc import Callable
from typing import Any


def default_instance_id(node: str | None = None) -> str:
    """``<node>:<pid>``: the instance id when none is configured.

    ``node`` is what operators know the process by (a Celery worker's
    ``name@host``); the host name when not given. The pid tells apart two
    processes of one node.
    """
    return f"{node or socket.gethostname()}:{os.getpid()}"


def after_fork_in_child(forget: Callable[[], Any]) -> None:
    """Run ``forget`` in a forked child before it runs anything else.

    For state that belongs to the parent's threads (leases, their locks and
    deadlines): those threads do not exist in the child, and the child must not
    believe in, or wait on, what they held. A bound method is held weakly, so an
    object that is gone is not kept alive for this.
    """
    if hasattr(forget, "__self__"):
        method = weakref.WeakMethod(forget)

        def call() -> None:
            bound = method()
            if bound is not None:
                bound()

        os.register_at_fork(after_in_child=call)
    else:
        os.register_at_fork(after_in_child=forget)
