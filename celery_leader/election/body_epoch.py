"""The epoch a leader-only body passed its check with: what ``current_epoch()`` says inside it.

A body starts after its leadership check said "leading". The lease can end in
between (a resign, a step-down, a missed renewal) before the body's first line
reads ``current_epoch()``, which would then answer ``None``: the body would run
under no epoch at all, although it was let through under one. So the check
reads the epoch itself, and the body runs with that epoch: ``current_epoch()``
of that election answers it for the body's duration, in the body's own context
(its thread, or its greenlet); ``is_leader()`` and ``ensure_leader()`` still
answer from the lease as it is now, so a body that asks learns of the loss.

Framework-free: ``@leader_only`` (:mod:`celery_leader.celery.decorators`) and
Dramatiq's leader-only check (:mod:`celery_leader.dramatiq.actors`) set it; both
``current_epoch()`` read it first.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import TypeAlias

__all__ = ["enter", "leave", "of", "only"]

# The innermost running body's (election, epoch, the body it runs in): a body
# nested in another (a decorated function its task calls) links to it. A chain
# of tuples rather than a dict: entering is on ``@leader_only``'s hot path.
_Chain: TypeAlias = "tuple[str, int, _Chain] | None"
_bodies: ContextVar[_Chain] = ContextVar("celery_leader_bodies", default=None)
_get = _bodies.get
_set = _bodies.set


def enter(election: str, epoch: int) -> Token[_Chain]:
    """A body that passed its check of ``election`` under ``epoch`` starts here."""
    return _set((election, epoch, _get()))


#: ``leave(token)``: the body :func:`enter` returned ``token`` for has ended.
leave = _bodies.reset


def only(election: str | None, epoch: int | None = None) -> None:
    """This context runs one body of ``election`` under ``epoch`` from now on; ``None``: none.

    For a worker thread that runs one message after another (Dramatiq's): each
    message replaces what the previous one left, so nothing outlives its body.
    """
    _set(None if election is None or epoch is None else (election, epoch, None))


def of(election: str) -> int | None:
    """The epoch the body running in this context passed its check of ``election`` with."""
    link = _get()
    while link is not None:
        if link[0] == election:
            return link[1]
        link = link[2]
    return None
