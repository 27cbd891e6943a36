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

from .backends import Backend, create_backend
from .config import LeaderConfig
from .lease import Lease

__all__ = ["LeaseSet", "lease_set", "stop_all"]

logger = logging.getLogger("celery_leader.lease")


class LeaseSet:
    """The leases this process holds with one set of settings, by election.

    Several parts of a process may join one election: each adds its own
    callback and health check, and the one lease runs them all.
    """

    def __init__(self, config: LeaderConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._backend: Backend | None = None
        self._leases: dict[str, Lease] = {}
        self._listeners: dict[str, list[Callable[[Lease], None]]] = {}
        self._checks: dict[str, list[Callable[[], str | None]]] = {}

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
    ) -> Lease:
        """The lease of ``election``, created on the first call; started unless ``start=False``.

        ``on_change`` runs after every election and demotion (in the lease's
        thread, or the one that stops it), and at once, in this thread, when
        the lease already leads; ``health_check`` is asked before every acquire
        and renewal, and any reason it gives makes the lease step down or stay
        out.
        """
        with self._lock:
            lease = self._leases.get(election)
            if lease is None:
                lease = Lease.from_config(
                    election,
                    self.config,
                    self.backend,
                    on_elected=self._changed,
                    on_demoted=self._changed,
                )
                lease.health_check = lambda: self._health(election)
                self._leases[election] = lease
            if on_change is not None:
                self._listeners.setdefault(election, []).append(on_change)
            if health_check is not None:
                self._checks.setdefault(election, []).append(health_check)
        if on_change is not None and lease.is_leader():
            on_change(lease)  # elected before this joiner listened (twice is harmless)
        if start:
            lease.start()
        return lease

    def get(self, election: str) -> Lease | None:
        """The lease of ``election`` if this process joined it, else ``None``."""
        return self._leases.get(election)

    def elections(self) -> list[str]:
        """The elections joined and not left."""
        return list(self._leases)

    def leave(self, election: str) -> None:
        """Leave ``election`` (demote, release, wake a follower); a later join starts afresh.

        Leaving the last election closes the store connection (the next use
        opens another).
        """
        with self._lock:
            lease = self._leases.pop(election, None)
        if lease is None:
            return
        lease.stop()
        with self._lock:
            if election not in self._leases:
                self._listeners.pop(election, None)
                self._checks.pop(election, None)
            backend = None
            if not self._leases:
                backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()

    def stop(self) -> None:
        """Leave every election, then close the store connection. Idempotent."""
        for election in self.elections():
            try:
                self.leave(election)
            except Exception:  # best effort: often called while the interpreter exits
                logger.exception("celery-leader: could not leave election %r", election)
        with self._lock:
            backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()

    def _changed(self, lease: Lease) -> None:
        for listener in list(self._listeners.get(lease.election, ())):
            listener(lease)

    def _health(self, election: str) -> str | None:
        for check in list(self._checks.get(election, ())):
            problem = check()
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
