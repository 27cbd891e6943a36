"""Lease stores. Only modules in this package talk to a store."""

from __future__ import annotations

from typing import TYPE_CHECKING

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


def create_backend(config: LeaderConfig) -> Backend:
    """Build the backend that ``config.url`` selects."""
    timeout = store_timeout(config.ttl, config.renew_interval)
    kind = config.store_kind
    if kind == "redis":
        from .redis import RedisBackend

        return RedisBackend(config.url, config.key_prefix, timeout)
    if kind == "postgres":
        from .postgres import PostgresBackend

        return PostgresBackend(config.url, config.key_prefix, timeout)
    if kind == "file":
        from .file import FileBackend

        return FileBackend(config.url, config.key_prefix, timeout)
    from .memory import MemoryBackend

    return MemoryBackend(config.url, config.key_prefix, timeout)
