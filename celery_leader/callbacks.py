"""What an elector tells the code that uses it, and what watches it: validated objects,
given at construction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from .backends import HolderInfo

#: The lease a callback is told of. Typed ``Any`` here because the lease module
#: imports this one; callbacks may annotate it as ``celery_leader.lease.Lease``.
LeaseArg = Any


@dataclass(frozen=True)
class Callbacks:
    """Callbacks of one lease. Each is optional; each runs in the lease's thread
    (``on_stopped`` may also run in the thread that stops the lease).

    * ``on_started(lease)``: this instance started leading. If it raises, the
      instance steps down and sits out one renew interval.
    * ``on_stopped(lease)``: this instance stopped leading; runs once for every
      ``on_started`` that returned.
    * ``on_new_leader(lease, holder)``: a leader was seen that was not seen
      before (another instance's new term on a follower, or this instance's own
      term once it leads). It fires on followers too.

    An exception from ``on_stopped`` or ``on_new_leader`` is logged and
    otherwise ignored: it cannot change who leads.
    """

    on_started: Callable[[LeaseArg], Any] | None = None
    on_stopped: Callable[[LeaseArg], Any] | None = None
    on_new_leader: Callable[[LeaseArg, HolderInfo], Any] | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None and not callable(value):
                raise TypeError(f"Callbacks.{field.name} must be callable or None, not {value!r}")


#: No callbacks.
NO_CALLBACKS = Callbacks()


@dataclass(frozen=True)
class Observer:
    """What watches a lease without taking part in it (Celery's signals, metrics).

    Each is optional; an exception from either is logged and otherwise ignored.

    * ``on_transition(lease, event, epoch)``: after this instance was announced
      leader (``event`` ``"elected"``) or stopped leading (``"demoted"``), with
      the epoch of the term that started or ended.
    * ``on_store_call(lease, operation, seconds, ok)``: after every store call
      timed by :meth:`~celery_leader.lease.Lease.observe` (``ok`` is False
      when it raised).

    Given to the lease when it is built (or to a
    :meth:`~celery_leader.leases.LeaseSet.join`), so that what a lease reports
    to is fixed by the code that made it, not by what the process imported.
    """

    on_transition: Callable[[LeaseArg, str, int], Any] | None = None
    on_store_call: Callable[[LeaseArg, str, float, bool], Any] | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None and not callable(value):
                raise TypeError(f"Observer.{field.name} must be callable or None, not {value!r}")
