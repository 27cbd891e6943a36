"""The members of a lease: every part of a process that takes part in one election
(a worker's step, beat, a decorated function) is one, and hears in pairs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..backends import HolderInfo
from .events import Callbacks, Events, LeaseArg, Observer

logger = logging.getLogger(__name__)


def guarded(name: str, lease: LeaseArg, callback: Callable[..., Any], *args: Any) -> bool:
    """Run a callback of ``lease``; what it raises is logged. Whether it returned."""
    try:
        callback(*args)
    except Exception:
        logger.exception("celery-leader: %s of %r failed", name, lease.election)
        return False
    return True


@dataclass(frozen=True, eq=False)
class Member:
    """What one member brings, fixed when it joins: ``callbacks``; ``on_change`` (after every
    announcement and demotion); ``health_check`` (a reason makes the lease step down or stay
    out); ``on_cycle``; ``observers`` (each once). ``pairs_refusal``: whether it hears
    "stopped" after its own ``on_started`` raised (a lease set's members do)."""

    callbacks: Callbacks | None = None
    on_change: Callable[[LeaseArg], Any] | None = None
    health_check: Callable[[], str | None] | None = None
    on_cycle: Callable[[LeaseArg], Any] | None = None
    observers: tuple[Observer, ...] = ()
    pairs_refusal: bool = True

    def __post_init__(self) -> None:
        if any(not isinstance(observer, Observer) for observer in self.observers):
            raise TypeError(f"observers must be Observer objects, not {self.observers!r}")
        if self.callbacks is not None and not isinstance(self.callbacks, Callbacks):
            raise TypeError(f"callbacks must be a Callbacks, not {self.callbacks!r}")


class Members(Events):
    """The members of one lease, and those told "started" and not yet "stopped": told
    "stopped" exactly once, whatever another raises (the lock: a join may tell "started"
    while the thread announces; callbacks run outside it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: list[Member] = []
        self._told: list[Member] = []

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, member: object) -> bool:
        return member in self._members

    def add(self, member: Member) -> None:
        with self._lock:
            self._members.append(member)

    def remove(self, member: Member, failed_join: LeaseArg | None = None) -> None:
        """It hears nothing more; after a ``failed_join`` of that lease, "stopped"
        first for a "started" it heard."""
        with self._lock:
            self._members = [m for m in self._members if m is not member]
            told = member in self._told
            self._told = [m for m in self._told if m is not member]
        if told and failed_join is not None:
            self._stopped(member, failed_join)

    def clear(self) -> None:
        """The lease ended: forget its members (those told "started" still hear "stopped")."""
        with self._lock:
            self._members = []

    def catch_up(self, member: Member, lease: LeaseArg) -> None:
        """What a member joining a running lease missed: ``on_change``, and
        ``on_started`` if the lease leads already. Raises what they raise."""
        if member.on_change is not None:
            member.on_change(lease)
        started = member.callbacks and member.callbacks.on_started
        if lease.is_leader() and self._tell(member) and started:
            started(lease)

    def on_started(self, lease: LeaseArg) -> None:
        for member in self._snapshot():
            started = member.callbacks and member.callbacks.on_started
            if not self._tell(member) or not started:
                continue  # told at its join already, or nothing to tell
            try:
                started(lease)
            except Exception:
                # The lease steps down unannounced and tells nobody "stopped": tell
                # it here, and no later member "started". Not on_change: nobody
                # heard of this term as led.
                for told in self._take_told():
                    if told is not member or member.pairs_refusal:
                        self._stopped(told, lease)
                raise
        self._changed(lease)

    def on_stopped(self, lease: LeaseArg) -> None:
        for member in self._take_told():
            self._stopped(member, lease)
        self._changed(lease)

    def on_transition(self, lease: LeaseArg, event: str, epoch: int) -> None:
        for observer in self._observers():
            if observer.on_transition is not None:
                guarded("on_transition", lease, observer.on_transition, lease, event, epoch)

    def on_new_leader(self, lease: LeaseArg, holder: HolderInfo) -> None:
        for member in self._snapshot():
            if member.callbacks is not None and member.callbacks.on_new_leader is not None:
                guarded("on_new_leader", lease, member.callbacks.on_new_leader, lease, holder)

    def on_store_call(
        self, lease: LeaseArg, operation: str, seconds: float, error: BaseException | None
    ) -> None:
        for observer in self._observers():
            if observer.on_store_call is not None:
                call = (lease, operation, seconds, error is None)
                guarded("on_store_call", lease, observer.on_store_call, *call)

    def on_cycle(self, lease: LeaseArg) -> None:
        for member in self._snapshot():
            if member.on_cycle is not None:
                guarded("on_cycle", lease, member.on_cycle, lease)

    def problem(self) -> str | None:
        checks = [member.health_check for member in self._snapshot() if member.health_check]
        return next(filter(None, (check() for check in checks)), None)

    def _snapshot(self) -> list[Member]:
        with self._lock:
            return list(self._members)

    def _tell(self, member: Member) -> bool:
        """Record ``member`` as told "started"; False when it was already."""
        with self._lock:
            told = member not in self._told
            if told:
                self._told.append(member)
            return told

    def _take_told(self) -> list[Member]:
        with self._lock:
            taken, self._told = self._told, []
            return taken

    def _stopped(self, member: Member, lease: LeaseArg) -> None:
        if member.callbacks is not None and member.callbacks.on_stopped is not None:
            guarded("on_stopped", lease, member.callbacks.on_stopped, lease)

    def _changed(self, lease: LeaseArg) -> None:
        for member in self._snapshot():
            if member.on_change is not None:
                member.on_change(lease)

    def _observers(self) -> list[Observer]:
        """Each once: members that report to the same signals or metrics must not
        count one transition twice."""
        found: list[Observer] = []
        for member in self._snapshot():
            found.extend(observer for observer in member.observers if observer not in found)
        return found
