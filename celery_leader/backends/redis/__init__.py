"""Redis store: ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``, Cluster.

:class:`~.backend.RedisBackend` is the store; :mod:`.presence` takes over from a
holder whose connection closed, and :mod:`.acks` keeps writes on the replicas.
"""

from __future__ import annotations

from .backend import RedisBackend

__all__ = ["RedisBackend"]
