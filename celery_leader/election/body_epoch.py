"""The epoch a leader-only body passed its check with: what ``current_epoch()`` says inside it.

The lease can end between the check and the body's first line, and the body must
not then run under no epoch at all: it keeps the one it was let through under
(``is_leader()`` and ``ensure_leader()`` still answer from the lease as it is now).
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

    For a worker thread that runs one message after another (Dramatiq's).
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
