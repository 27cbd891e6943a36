"""What every store is: a lock store and a fenced-state store on one connection."""

from __future__ import annotations

from .fenced import FencedState
from .lock import LockStore


class Backend(LockStore, FencedState):
    """One store, both interfaces. One instance may serve several elections and threads."""

    #: How many replicas of the store must hold a write (and a new term) before
    #: :meth:`claim` (and :meth:`acquire`) return it; ``None``: as many as the
    #: store's topology needs so that a promotion cannot roll it back ("auto").
    #: Set from ``leader_replica_acks`` by ``create_backend``; stores without
    #: replicas ignore it.
    replica_acks: int | None = None

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        self.url = url
        self.key_prefix = key_prefix
        #: Deadline of every store call, in seconds.
        self.timeout = timeout

    def close(self) -> None:
        """Release every connection and resource of the backend."""
