"""This process's leases: one per election and settings, on one store connection.

Everything that campaigns from a process joins through here, so a process never
holds two leases of one election (they would compete), a forked child starts with
none of its parent's, and a normal exit leaves every election.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..backends import HolderInfo, StoreFacets, open_store
from ..settings.config import LeaderConfig
from ..settings.process import after_fork_in_child
from .events import Callbacks, Observer
from .lease import Lease
from .members import Member

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Membership:
    """One joiner's share of ``lease``, the election's one lease in this process."""

    owner: LeaseSet = field(repr=False)
    lease: Lease
    member: Member

    def leave(self) -> None:
        """Stop taking part. The last member to leave ends the lease (demote, release,
        wake a follower) and hears that demotion; an earlier one just stops listening."""
        self.owner._leave(self)


class LeaseSet:
    """The leases this process holds with one set of settings, by election: several
    parts of a process may join one, each with a :class:`Membership` of its own."""

    def __init__(self, config: LeaderConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._store: StoreFacets | None = None
        self._leases: dict[str, Lease] = {}  # a join after the last member left makes another

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
        """A membership of ``election``'s lease, created on the first join; started unless
        ``start=False``. Joining a started lease runs ``on_change`` at once, in this thread,
        and ``on_started`` if it leads."""
        member = Member(callbacks, on_change, health_check, on_cycle, tuple(observers))
        with self._lock:
            lease = self._leases.get(election)
            shared = lease is not None
            if lease is None:
                lease = self._leases[election] = Lease.from_config(
                    election, self.config, self.store.lock, journal=self.store.journal
                )
            lease.members.add(member)
        membership = Membership(self, lease, member)
        try:
            if shared:  # it may have been elected before this member listened
                lease.members.catch_up(member, lease)
            if start:
                lease.start()
        except BaseException:
            self._leave(membership, failed=True)
            raise
        return membership

    def elections(self) -> list[str]:
        """The elections joined and not left."""
        return list(self._leases)

    def lease_of(self, election: str) -> Lease | None:
        """The lease of ``election`` if a part of this process joined it, else ``None``;
        it never joins and never talks to the store (what ``is_leader()`` asks)."""
        with self._lock:
            return self._leases.get(election)

    def _leave(self, membership: Membership, failed: bool = False) -> None:
        lease, member = membership.lease, membership.member
        if failed:
            # A join that fails leaves nothing behind: the member hears "stopped"
            # for any "started" it heard, and a lease it alone joined ends.
            lease.members.remove(member, failed_join=lease)
        with self._lock:
            if self._leases.get(lease.election) is not lease:
                return  # the lease ended, or the set was stopped
            if failed:
                if len(lease.members):
                    return  # others take part
            elif member not in lease.members:
                return  # left already
            elif len(lease.members) > 1:
                lease.members.remove(member)  # it stops listening: it hears no "stopped"
                return
            # The last member, which hears the demotion: a join from now on starts a new lease.
            del self._leases[lease.election]
        _end(lease)
        self.close_if_idle()

    def stop(self) -> None:
        """End every lease, whoever joined it, then close the store connection. Idempotent."""
        with self._lock:
            ending, self._leases = list(self._leases.values()), {}
        for lease in ending:
            try:
                _end(lease)
            except Exception:  # best effort: often called while the interpreter exits
                logger.exception("celery-leader: could not leave election %r", lease.election)
        self.close_if_idle()

    def close_if_idle(self) -> None:
        """Close the store connection unless an election is joined (checked under the set's
        lock, so a lease joined meanwhile keeps it); the next use opens another."""
        with self._lock:
            if self._leases:
                return
            store, self._store = self._store, None
        if store is not None:
            store.close()


def _end(lease: Lease) -> None:
    """Stop ``lease`` (its members hear the demotion), then forget its members."""
    lease.stop()
    lease.members.clear()


# One lease set per settings per process: every part of a process that joins an
# election must find the one lease of it, whichever module joins first.
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
    """Who leads ``election`` (default: the worker election), asked of the store without
    joining (one round trip); ``None`` when nobody leads. Raises ``StoreUnavailable``."""
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
