"""This process's leases: one per election and settings, on one store connection.

Everything that campaigns from a process joins through here: a Celery worker's
node, a function's own election (``is_leader()`` outside a worker), a Dramatiq
worker process and the schedulers. So:

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
import os
import threading
from collections.abc import Callable

from .backends import Backend, HolderInfo, create_backend
from .config import LeaderConfig
from .lease import Lease

__all__ = ["LeaseSet", "Membership", "lease_set", "stop_all"]

logger = logging.getLogger("celery_leader.lease")


class Membership:
    """One joiner's share of a lease: its callback and health check, until it leaves."""

    def __init__(
        self,
        owner: LeaseSet,
        lease: Lease,
        on_change: Callable[[Lease], None] | None,
        health_check: Callable[[], str | None] | None,
        on_new_leader: Callable[[HolderInfo], None] | None = None,
    ) -> None:
        self._owner = owner
        #: The election's one lease in this process.
        self.lease = lease
        self.on_change = on_change
        self.health_check = health_check
        self.on_new_leader = on_new_leader

    def leave(self) -> None:
        """Stop taking part. The last member to leave ends the lease (demote, release,
        wake a follower) and hears that demotion; an earlier one just stops listening."""
        self._owner._leave(self)


class LeaseSet:
    """The leases this process holds with one set of settings, by election.

    Several parts of a process may join one election: each gets a
    :class:`Membership` with its own callback and health check, and the one
    lease runs them all until the last member leaves.
    """

    def __init__(self, config: LeaderConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._backend: Backend | None = None
        # election -> its lease and that lease's members (a new lease, a new list)
        self._leases: dict[str, tuple[Lease, list[Membership]]] = {}

    @property
    def backend(self) -> Backend:
        """The store connection of these settings, opened on first use."""
        with self._lock:
            if self._backend is None:
                self._backend = create_backend(self.config)
            return self._backend

    def join(
        self,
        election: str,
        *,
        on_change: Callable[[Lease], None] | None = None,
        health_check: Callable[[], str | None] | None = None,
        start: bool = True,
        on_new_leader: Callable[[HolderInfo], None] | None = None,
    ) -> Membership:
        """A membership of ``election``'s lease, created on the first join; started
        unless ``start=False``.

        ``on_change`` runs after every election and demotion (in the lease's
        thread, or the one that stops it), and at once, in this thread, when
        another member started the lease already (it may lead by now);
        ``health_check`` is asked before every acquire
        and renewal, and any reason it gives makes the lease step down or stay
        out. ``on_new_leader`` runs in the lease's thread for every new holder
        seen (followers see them too), and at once with the last one seen when
        the lease was started already.
        """
        with self._lock:
            found = self._leases.get(election)
            shared = found is not None
            if found is None:
                members: list[Membership] = []
                lease = Lease.from_config(
                    election,
                    self.config,
                    self.backend,
                    on_elected=lambda lease: _notify(members, lease),
                    on_demoted=lambda lease: _notify(members, lease),
                    on_new_holder=lambda holder: _notify_holder(members, holder),
                )
                lease.health_check = lambda: _first_problem(members)
                found = self._leases[election] = (lease, members)
            lease, members = found
            membership = Membership(self, lease, on_change, health_check, on_new_leader)
            members.append(membership)
        if on_change is not None and shared:
            on_change(lease)  # it may have been elected before this member listened
        holder = lease.last_holder
        if on_new_leader is not None and shared and holder is not None:
            on_new_leader(holder)
        if start:
            lease.start()
        return membership

    def elections(self) -> list[str]:
        """The elections joined and not left."""
        return list(self._leases)

    def _leave(self, membership: Membership) -> None:
        lease = membership.lease
        with self._lock:
            found = self._leases.get(lease.election)
            if found is None or found[0] is not lease or membership not in found[1]:
                return  # left already, or the set was stopped
            members = found[1]
            if len(members) > 1:
                members.remove(membership)
                return
            # The last member: a join from now on starts a new lease.
            del self._leases[lease.election]
        _end(lease, members)
        self.close_if_idle()

    def stop(self) -> None:
        """End every lease, whoever joined it, then close the store connection. Idempotent."""
        with self._lock:
            ending, self._leases = list(self._leases.values()), {}
        for lease, members in ending:
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
            backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()


def _end(lease: Lease, members: list[Membership]) -> None:
    """Stop ``lease`` (its members hear the demotion), then forget its members."""
    lease.stop()
    members.clear()


def _notify(members: list[Membership], lease: Lease) -> None:
    for member in list(members):
        if member.on_change is not None:
            member.on_change(lease)


def _notify_holder(members: list[Membership], holder: HolderInfo) -> None:
    for member in list(members):
        if member.on_new_leader is not None:
            member.on_new_leader(holder)


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


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(stop_all)
