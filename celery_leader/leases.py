"""This process's leases: one per election and settings, on one store connection.

Everything that campaigns from a process joins through here: a Celery worker's
node, a function's own election (``@leader_only`` on a plain function outside a
worker), a Dramatiq worker process and the schedulers. So:

* a process never holds two leases of one election (with one instance id, they
  would compete with each other, and ``is_leader()`` would depend on which one
  a caller asked);
* the leases of one set of settings share one store connection;
* a forked child starts with none of its parent's (their threads do not exist
  there, and their deadlines would freeze);
* a normal exit leaves every election, so another instance takes over at once.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .backends import HolderInfo, StoreFacets, open_store
from .callbacks import Callbacks, Observer
from .config import LeaderConfig
from .lease import Lease
from .process import after_fork_in_child

__all__ = ["LeaseSet", "Membership", "leader_of", "lease_set", "stop_all"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Membership:
    """One joiner's share of a lease: everything the joiner brings, until it leaves.

    Its ``callbacks``, ``on_change``, ``health_check``, ``on_cycle`` and
    ``observers`` are fixed when it joins; the lease runs those of every member
    (an observer that several members brought, once).
    """

    owner: LeaseSet = field(repr=False)
    #: The election's one lease in this process.
    lease: Lease
    callbacks: Callbacks | None
    on_change: Callable[[Lease], None] | None
    health_check: Callable[[], str | None] | None
    on_cycle: Callable[[Lease], None] | None
    observers: tuple[Observer, ...] = ()

    def leave(self) -> None:
        """Stop taking part. The last member to leave ends the lease (demote, release,
        wake a follower) and hears that demotion; an earlier one just stops listening."""
        self.owner._leave(self)


class LeaseSet:
    """The leases this process holds with one set of settings, by election.

    Several parts of a process may join one election: each gets a
    :class:`Membership` with its own callbacks and health check, and the one
    lease runs them all until the last member leaves.
    """

    def __init__(self, config: LeaderConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._store: StoreFacets | None = None
        # election -> its lease, that lease's members (a new lease, a new list) and
        # those of them told "started" and not yet "stopped"
        self._leases: dict[str, tuple[Lease, list[Membership], _Told]] = {}

    @property
    def store(self) -> StoreFacets:
        """The store of these settings (its facets, on one connection), opened on first use."""
        with self._lock:
            if self._store is None:
                self._store = open_store(self.config)
            return self._store

    def join(
        self,
        election: str,
        *,
        callbacks: Callbacks | None = None,
        on_change: Callable[[Lease], None] | None = None,
        health_check: Callable[[], str | None] | None = None,
        on_cycle: Callable[[Lease], None] | None = None,
        observers: Iterable[Observer] = (),
        start: bool = True,
    ) -> Membership:
        """A membership of ``election``'s lease, created on the first join; started
        unless ``start=False``.

        ``callbacks`` (:class:`~celery_leader.callbacks.Callbacks`) hear this
        instance start and stop leading and every new leader seen; joining a
        lease that leads already runs ``on_started`` at once, in this thread.
        ``on_change`` runs after every election and demotion (in the lease's
        thread, or the one that stops it), and at once, in this thread, when
        another member started the lease already (it may lead by now);
        ``health_check`` is asked before every acquire and renewal, and any
        reason it gives makes the lease step down or stay out; ``on_cycle`` runs
        after every acquire or renew cycle; ``observers``
        (:class:`~celery_leader.callbacks.Observer`) watch the lease's
        transitions and store calls while this member takes part.
        """
        observers = tuple(observers)
        if any(not isinstance(observer, Observer) for observer in observers):
            raise TypeError(f"observers must be Observer objects, not {observers!r}")
        if callbacks is not None and not isinstance(callbacks, Callbacks):
            raise TypeError(f"callbacks must be a Callbacks, not {callbacks!r}")
        with self._lock:
            found = self._leases.get(election)
            shared = found is not None
            if found is None:
                members: list[Membership] = []
                told = _Told()
                lease = Lease.from_config(
                    election,
                    self.config,
                    self.store.lock,
                    callbacks=Callbacks(
                        on_started=lambda lease: _started(members, told, lease),
                        on_stopped=lambda lease: _stopped(members, told, lease),
                        on_new_leader=lambda lease, holder: _new_leader(members, lease, holder),
                    ),
                    observers=(
                        Observer(
                            on_transition=lambda lease, *event: _transition(members, lease, *event),
                            on_store_call=lambda lease, *call: _store_call(members, lease, *call),
                        ),
                    ),
                    health_check=lambda: _first_problem(members),
                    on_cycle=lambda lease: _cycle(members, lease),
                )
                found = self._leases[election] = (lease, members, told)
            lease, members, told = found
            membership = Membership(
                self, lease, callbacks, on_change, health_check, on_cycle, observers
            )
            members.append(membership)
        try:
            if shared:
                # It may have been elected before this member listened.
                if on_change is not None:
                    on_change(lease)
                if lease.is_leader() and told.add(membership):
                    if callbacks is not None and callbacks.on_started is not None:
                        callbacks.on_started(lease)
            if start:
                lease.start()
        except BaseException:
            # A join that fails leaves nothing behind: the member hears "stopped"
            # for the "started" it heard, and the lease it alone joined ends.
            if told.discard(membership):
                _tell_stopped(membership, lease)
            membership.leave()
            raise
        return membership

    def elections(self) -> list[str]:
        """The elections joined and not left."""
        return list(self._leases)

    def lease_of(self, election: str) -> Lease | None:
        """The lease of ``election`` if a part of this process joined it, else ``None``.

        It never joins and never talks to the store: what ``is_leader()`` asks.
        """
        with self._lock:
            found = self._leases.get(election)
        return None if found is None else found[0]

    def _leave(self, membership: Membership) -> None:
        lease = membership.lease
        with self._lock:
            found = self._leases.get(lease.election)
            if found is None or found[0] is not lease or membership not in found[1]:
                return  # left already, or the set was stopped
            members, told = found[1], found[2]
            if len(members) > 1:
                members.remove(membership)
                told.discard(membership)  # it stops listening: it hears no "stopped"
                return
            # The last member: a join from now on starts a new lease.
            del self._leases[lease.election]
        _end(lease, members)
        self.close_if_idle()

    def stop(self) -> None:
        """End every lease, whoever joined it, then close the store connection. Idempotent."""
        with self._lock:
            ending, self._leases = list(self._leases.values()), {}
        for lease, members, _told in ending:
            try:
                _end(lease, members)
            except Exception:  # best effort: often called while the interpreter exits
                logger.exception("celery-leader: could not leave election %r", lease.election)
        self.close_if_idle()

    def close_if_idle(self) -> None:
        """Close the store connection unless an election is joined; the next use
        opens another. Checked and taken under the set's lock, so a lease joined
        meanwhile keeps its connection."""
        with self._lock:
            if self._leases:
                return
            store, self._store = self._store, None
        if store is not None:
            store.close()


def _end(lease: Lease, members: list[Membership]) -> None:
    """Stop ``lease`` (its members hear the demotion), then forget its members."""
    lease.stop()
    members.clear()


class _Told:
    """The members of one lease told "started" and not yet "stopped".

    Members hear the two in pairs whatever another member raises: the lease
    tells "stopped" only when it announced its term, so a member's ``on_started``
    that raises (and makes the lease step down unannounced) must not leave
    earlier members believing they lead. Joins run ``on_started`` in the joining
    thread while the lease's thread may announce the same term, hence the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: list[Membership] = []

    def add(self, member: Membership) -> bool:
        """Record ``member`` as told "started"; False when it was already."""
        with self._lock:
            if member in self._members:
                return False
            self._members.append(member)
            return True

    def discard(self, member: Membership) -> bool:
        """Forget ``member``; whether it had been told "started"."""
        with self._lock:
            if member not in self._members:
                return False
            self._members.remove(member)
            return True

    def take(self) -> list[Membership]:
        """Every member told "started", in the order told, forgetting them."""
        with self._lock:
            taken, self._members = self._members, []
            return taken


def _started(members: list[Membership], told: _Told, lease: Lease) -> None:
    for member in list(members):
        if not told.add(member):
            continue  # told at its join already
        if member.callbacks is None or member.callbacks.on_started is None:
            continue
        try:
            member.callbacks.on_started(lease)
        except Exception:
            # The lease logs this and steps down without announcing, so it will
            # not tell "stopped": tell it here to every member told "started",
            # this one included, and tell no later member "started". Not
            # on_change: no member heard of this term, and the lease still
            # believes it here (a gate would open for it).
            for told_member in told.take():
                _tell_stopped(told_member, lease)
            raise
    _changed(members, lease)


def _stopped(members: list[Membership], told: _Told, lease: Lease) -> None:
    for member in told.take():
        _tell_stopped(member, lease)
    _changed(members, lease)


def _tell_stopped(member: Membership, lease: Lease) -> None:
    if member.callbacks is not None and member.callbacks.on_stopped is not None:
        _guarded("on_stopped", member.callbacks.on_stopped, lease)


def _changed(members: list[Membership], lease: Lease) -> None:
    for member in list(members):
        if member.on_change is not None:
            member.on_change(lease)


def _new_leader(members: list[Membership], lease: Lease, holder: HolderInfo) -> None:
    for member in list(members):
        if member.callbacks is not None and member.callbacks.on_new_leader is not None:
            _guarded("on_new_leader", member.callbacks.on_new_leader, lease, holder)


def _observers(members: list[Membership]) -> list[Observer]:
    """The members' observers, each once: two members that report to the same
    signals or metrics must not count one transition twice."""
    found: list[Observer] = []
    for member in list(members):
        found.extend(observer for observer in member.observers if observer not in found)
    return found


def _transition(members: list[Membership], lease: Lease, event: str, epoch: int) -> None:
    for observer in _observers(members):
        if observer.on_transition is not None:
            _guarded("on_transition", observer.on_transition, lease, event, epoch)


def _store_call(
    members: list[Membership], lease: Lease, operation: str, seconds: float, ok: bool
) -> None:
    for observer in _observers(members):
        if observer.on_store_call is not None:
            _guarded("on_store_call", observer.on_store_call, lease, operation, seconds, ok)


def _cycle(members: list[Membership], lease: Lease) -> None:
    for member in list(members):
        if member.on_cycle is not None:
            _guarded("on_cycle", member.on_cycle, lease)


def _guarded(name: str, callback: Callable[..., Any], lease: Lease, *args: Any) -> None:
    """One member's callback failing must not keep the others from hearing."""
    try:
        callback(lease, *args)
    except Exception:
        logger.exception("celery-leader: %s of a member of %r failed", name, lease.election)


def _first_problem(members: list[Membership]) -> str | None:
    for member in list(members):
        problem = None if member.health_check is None else member.health_check()
        if problem:
            return problem
    return None


_sets: dict[LeaderConfig, LeaseSet] = {}
_lock = threading.Lock()


def lease_set(config: LeaderConfig) -> LeaseSet:
    """This process's lease set for ``config``."""
    with _lock:
        found = _sets.get(config)
        if found is None:
            found = _sets[config] = LeaseSet(config)
        return found


def leader_of(config: LeaderConfig, election: str | None = None) -> HolderInfo | None:
    """Who leads ``election`` (default: the worker election), asked of the store.

    It does not join the election, so the answer is the same in any process, on
    Celery and on Dramatiq: one round trip on this process's connection for
    ``config``. ``None`` when nobody leads. Raises
    :class:`~celery_leader.exceptions.StoreUnavailable`.
    """
    leases = lease_set(config)
    try:
        return leases.store.lock.holder(election or config.worker_election)
    finally:
        leases.close_if_idle()


def stop_all() -> None:
    """Leave every election this process joined and close its store connections."""
    with _lock:
        sets = list(_sets.values())
        _sets.clear()
    for leases in sets:
        leases.stop()


def _after_fork_in_child() -> None:
    # The parent's lease threads do not exist here: forget them, do not stop them.
    global _lock
    _lock = threading.Lock()
    _sets.clear()


after_fork_in_child(_after_fork_in_child)
atexit.register(stop_all)
