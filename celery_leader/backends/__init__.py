"""Lease stores. Only modules in this package talk to a store."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ..exceptions import missing_extra
from .base import Acquired, Backend, Claim, HolderInfo, Renewal, Tenure

if TYPE_CHECKING:
    from ..config import LeaderConfig

__all__ = ["Acquired", "Backend", "Claim", "HolderInfo", "Renewal", "Tenure", "create_backend"]


def store_timeout(ttl: float, renew_interval: float) -> float:
    """Deadline of one store call.

    A renewal sent ``renew_interval`` after the last good one must give up
    while the lease is still valid (``ttl - renew_interval`` left), so the
    leader gets to retry; and no call should outlast one renew interval.
    """
    return max(0.05, min(renew_interval, ttl - renew_interval))


#: Store kind -> (module, class) of its backend, and the extra that installs its client.
_BACKENDS = {
    "redis": (".redis", "RedisBackend", "redis"),
    "postgres": (".postgres", "PostgresBackend", "postgres"),
    "file": (".file", "FileBackend", None),
    "memory": (".memory", "MemoryBackend", None),
}


def create_backend(config: LeaderConfig) -> Backend:
    """Build the backend that ``config.url`` selects.

    A store whose client is not installed fails in one line naming its extra.
    """
    module_name, class_name, extra = _BACKENDS[config.store_kind]
    try:
        module = importlib.import_module(module_name, __name__)
    except ModuleNotFoundError as exc:
        if extra is None:
            raise
        raise missing_extra(exc, extra) from None
    backend: Backend = getattr(module, class_name)(
        config.url, config.key_prefix, store_timeout(config.ttl, config.renew_interval)
    )
    return backend
