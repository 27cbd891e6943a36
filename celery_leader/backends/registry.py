"""The one table of lease stores: schemes, backend classes and the extras they need.

A leaf module (it imports nothing of the package), so that
:mod:`celery_leader.config` can validate URLs against it while
:mod:`celery_leader.backends` builds backends from a validated config.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Store:
    """One kind of lease store."""

    kind: str
    schemes: tuple[str, ...]
    module: str
    class_name: str
    #: The extra (``pip install 'celery-leader[<extra>]'``) that installs its client.
    extra: str | None = None


STORES: tuple[Store, ...] = (
    Store(
        "redis", ("redis", "rediss", "unix", "redis+sentinel"), ".redis", "RedisBackend", "redis"
    ),
    Store(
        "postgres", ("postgresql", "postgres", "django"), ".postgres", "PostgresBackend", "postgres"
    ),
    Store("etcd", ("etcd", "etcds"), ".etcd", "EtcdBackend", "etcd"),
    Store("file", ("file",), ".file", "FileBackend"),
    Store("memory", ("memory",), ".memory", "MemoryBackend"),
)

_BY_SCHEME = {scheme: store for store in STORES for scheme in store.schemes}


def store_for(scheme: str) -> Store | None:
    """The store that URLs of ``scheme`` (lower case) select, if any."""
    return _BY_SCHEME.get(scheme)
