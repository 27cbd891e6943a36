"""The one table of stores: schemes, store modules and the extras they need.

A leaf module (it imports nothing of the package), so the settings can validate
URLs against it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Store:
    """One kind of lease store."""

    kind: str
    schemes: tuple[str, ...]
    #: The module (relative to ``celery_leader.backends``) whose ``open_store``
    #: opens it.
    module: str
    #: The extra (``pip install 'celery-leader[<extra>]'``) that installs its client.
    extra: str | None = None
    #: How messages show a URL of this store; its first scheme by default.
    shown: str = ""

    @property
    def hint(self) -> str:
        """The start of a URL of this store, as error messages show it."""
        return self.shown or f"{self.schemes[0]}://"


#: ``django://ALIAS`` is listed with PostgreSQL, where it began; the settings
#: resolve it by the alias's ``ENGINE`` before a store is opened.
STORES: tuple[Store, ...] = (
    Store("redis", ("redis", "rediss", "unix", "redis+sentinel"), ".redis", "redis"),
    Store("postgres", ("postgresql", "postgres", "django"), ".postgres", "postgres"),
    Store("mysql", ("mysql", "mariadb"), ".mysql", "mysql"),
    Store("etcd", ("etcd", "etcds"), ".etcd", "etcd"),
    Store("file", ("file",), ".file", shown="file:///dir"),
    Store("memory", ("memory",), ".memory"),
)

_BY_SCHEME = {scheme: store for store in STORES for scheme in store.schemes}


def store_hints() -> str:
    """Every store, one URL start each, for messages that say what to set:
    ``redis://, postgresql://, ... or memory://``. Read from :data:`STORES`, so
    a store added there is named in them too."""
    hints = [store.hint for store in STORES]
    return f"{', '.join(hints[:-1])} or {hints[-1]}"


def store_for(scheme: str) -> Store | None:
    """The store that URLs of ``scheme`` (lower case) select, if any."""
    return _BY_SCHEME.get(scheme)
