"""What an elector tells: :class:`Callbacks` and :class:`Observer` are what a caller
hands over; :class:`Events` is the one protocol every listener of an elector speaks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..backends import HolderInfo

#: The lease a callback is told of. Typed ``Any`` here because the lease module
#: imports this one; callbacks may annotate it as ``celery_leader.Lease``.
LeaseArg = Any


def _check_callables(owner: Any) -> None:
    for field in fields(owner):
        value = getattr(owner, field.name)
        if value is not None and not callable(value):
            name = type(owner).__name__
            raise TypeError(f"{name}.{field.name} must be callable or None, not {value!r}")


@dataclass(frozen=True)
class Callbacks:
    """Callbacks of one lease, each optional, run in the lease's thread (``on_stopped`` may
    also run in the thread that stops the lease).

    * ``on_started(lease)``: this instance leads. If it raises, the instance steps down
      and sits out one renew interval.
    * ``on_stopped(lease)``: it stopped leading; once for every ``on_started`` that returned.
    * ``on_new_leader(lease, holder)``: a term not seen before, on followers too.

    What ``on_stopped`` or ``on_new_leader`` raise is logged and ignored.
    """

    on_started: Callable[[LeaseArg], Any] | None = None
    on_stopped: Callable[[LeaseArg], Any] | None = None
    on_new_leader: Callable[[LeaseArg, HolderInfo], Any] | None = None

    def __post_init__(self) -> None:
        _check_callables(self)


#: No callbacks.
NO_CALLBACKS = Callbacks()


@dataclass(frozen=True)
class Observer:
    """What watches a lease without taking part in it (Celery's signals, metrics); each is
    optional, and what it raises is logged and ignored.

    * ``on_transition(lease, event, epoch)``: after ``"elected"`` or ``"demoted"``.
    * ``on_store_call(lease, operation, seconds, ok)``: after every store call timed by
      the lease's ``observe``.
    """

    on_transition: Callable[[LeaseArg, str, int], Any] | None = None
    on_store_call: Callable[[LeaseArg, str, float, bool], Any] | None = None

    def __post_init__(self) -> None:
        _check_callables(self)


class Events:
    """The events an elector tells each of its listeners in turn, every one a no-op
    here. What a listener raises is logged; from ``on_started``, it refuses the term."""

    def on_started(self, lease: LeaseArg) -> None:
        """The term is believed, and about to be announced."""

    def on_stopped(self, lease: LeaseArg) -> None:
        """The announced term ended; it is released after this."""

    def on_transition(self, lease: LeaseArg, event: str, epoch: int) -> None:
        """``"elected"`` after the announcement, ``"demoted"`` after ``on_stopped``."""

    def on_new_leader(self, lease: LeaseArg, holder: HolderInfo) -> None:
        """A holder not seen before: in a store's answer, or this instance's own term."""

    def on_released(self, lease: LeaseArg, epoch: int, how: str) -> None:
        """The announced term ``epoch`` was given back to the store (or the attempt
        failed) after ``on_stopped``; ``how`` is why it ended (``last_demotion``)."""

    def on_answer(self, lease: LeaseArg, sent: float, store_time: float | None) -> None:
        """An acquire or renewal sent at ``sent`` (monotonic) was answered at the
        store's ``store_time`` (``None`` for a store without a clock)."""

    def on_store_call(
        self, lease: LeaseArg, operation: str, seconds: float, error: BaseException | None
    ) -> None:
        """A store call timed by ``observe`` returned (``error`` is ``None``) or raised."""

    def on_cycle(self, lease: LeaseArg) -> None:
        """The thread ended one cycle."""

    def problem(self) -> str | None:
        """Why this instance must not lead now: asked before every acquire and renewal."""
        return None
