"""Leadership pinned by a test: :func:`as_leader` and :func:`as_follower`.

Inside a pin every leadership check of this process (every thread, not other
processes) answers "leading" or "not leading"; outside, the real lease decides.
Both frameworks ask :func:`role_of` before their lease.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..settings.config import validate_name

__all__ = ["Role", "as_follower", "as_leader", "on_reset", "reset", "role_of", "watch"]


@dataclass(frozen=True, eq=False)
class Role:
    """One pin: ``election`` (``None``: every election) led under ``epoch``, or followed."""

    election: str | None
    #: The fencing token this process reports while the pin holds; ``None``: a follower.
    epoch: int | None

    @property
    def leads(self) -> bool:
        """True for a leader's pin."""
        return self.epoch is not None


# Innermost pin last. Replaced whole, never mutated: readers in other threads
# (a worker's pool) see one consistent tuple without taking the lock.
_pins: tuple[Role, ...] = ()
_lock = threading.Lock()
_watchers: list[Callable[[], None]] = []
_resets: list[Callable[[], None]] = []
# Each as_leader() without epoch= starts a new term, with a higher epoch than
# any pinned before in this process, as a real election would.
_epochs = itertools.count(1)


def role_of(election: str) -> Role | None:
    """The innermost pin covering ``election``; ``None`` when the real lease decides."""
    for role in reversed(_pins):
        if role.election is None or role.election == election:
            return role
    return None


def watch(callback: Callable[[], None]) -> None:
    """Call ``callback()`` after every change of the pins (to drop cached answers)."""
    _watchers.append(callback)


@contextmanager
def as_leader(election: str | None = None, *, epoch: int | None = None) -> Iterator[int]:
    """Within the block, this process leads ``election`` (default: every election).

    Yields the epoch that ``current_epoch()`` reports: ``epoch``, or else one
    higher than any pinned before in this process. Works as a decorator too.
    """
    if epoch is None:
        epoch = next(_epochs)
    elif isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise ValueError(f"as_leader: epoch must be an integer >= 1 (got {epoch!r})")
    with _pinned(Role(_checked(election), epoch)):
        yield epoch


@contextmanager
def as_follower(election: str | None = None) -> Iterator[None]:
    """Within the block, this process does not lead ``election`` (default: any election);
    another node is assumed to lead. Works as a decorator too."""
    with _pinned(Role(_checked(election), None)):
        yield


def _checked(election: str | None) -> str | None:
    return None if election is None else validate_name("election", election)


@contextmanager
def _pinned(role: Role) -> Iterator[None]:
    global _pins
    with _lock:
        _pins = (*_pins, role)
    _changed()
    try:
        yield
    finally:
        with _lock:
            # By identity: blocks may end out of order (generators, threads).
            _pins = tuple(r for r in _pins if r is not role)
        _changed()


def _changed() -> None:
    for callback in list(_watchers):
        callback()


def on_reset(callback: Callable[[], None]) -> None:
    """Call ``callback()`` from :func:`reset` (a framework forgets its cached state)."""
    _resets.append(callback)


def reset() -> None:
    """Between tests: end every pin, and let each framework forget what it learnt (Celery's
    side then reads its settings afresh and leaves the elections joined in the test)."""
    global _pins
    with _lock:
        _pins = ()
    _changed()
    for callback in list(_resets):
        callback()
