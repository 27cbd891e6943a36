"""Stores. Only modules in this package talk to a store.

Each store module exports ``open_store(StoreParams) -> StoreFacets``: its facets
(:class:`LeaseLock`, :class:`FencedRecords`, :class:`EntryStore`,
:class:`RunStore`, :class:`Journal`) on one connection; :data:`STORES` lists the stores.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..exceptions import missing_extra
from .entry_store import Edit, EntryStore
from .journal import Journal, JournalWrite
from .lock import Acquired, HolderInfo, LeaseLock, Renewal, Term
from .records import Fence, FencedRecords, Write
from .registry import STORES, Store, store_for
from .run_store import RunStore, RunSummary, RunWrite


class StoreSettings(Protocol):
    """What :func:`open_store` reads of the settings (so stores never import them)."""

    @property
    def store(self) -> Store: ...
    @property
    def url(self) -> str: ...
    @property
    def key_prefix(self) -> str: ...
    #: Deadline of every store call, in seconds (the elector's timing decides it).
    @property
    def store_timeout(self) -> float: ...
    @property
    def replica_acks(self) -> int | None: ...
    @property
    def connection(self) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True)
class StoreParams:
    """What a store module's ``open_store`` is given."""

    url: str
    key_prefix: str
    #: Deadline of every store call, in seconds.
    timeout: float
    #: Replicas that must hold a write before a claim returns it; ``None``: as
    #: many as a promotion needs ("auto").
    replica_acks: int | None = None
    #: The client's connection parameters when not from ``url`` (``django://``);
    #: ``url`` then only names the store in messages.
    connection: Mapping[str, Any] | None = field(default=None, hash=False)


@dataclass(frozen=True, eq=False)
class StoreFacets:
    """One opened store: its facets on one connection, not made until first used."""

    params: StoreParams
    lock: LeaseLock
    records: FencedRecords
    entries: EntryStore
    runs: RunStore
    journal: Journal
    #: Releases every connection and resource of the store.
    close: Callable[[], None]

    @property
    def url(self) -> str:
        """The store's URL, password and all: mask it before showing it."""
        return self.params.url

    @property
    def timeout(self) -> float:
        """Deadline of every store call, in seconds."""
        return self.params.timeout


__all__ = [
    "STORES",
    "Acquired",
    "Edit",
    "EntryStore",
    "Fence",
    "FencedRecords",
    "HolderInfo",
    "Journal",
    "JournalWrite",
    "LeaseLock",
    "Renewal",
    "RunStore",
    "RunSummary",
    "RunWrite",
    "Store",
    "StoreFacets",
    "StoreParams",
    "StoreSettings",
    "Term",
    "Write",
    "open_store",
    "store_for",
]


def open_store(config: StoreSettings) -> StoreFacets:
    """Open the store ``config.url`` selects (not yet contacted); no client: names its extra."""
    store = config.store
    try:
        module = importlib.import_module(store.module, __name__)
    except ModuleNotFoundError as exc:
        if store.extra is None:
            raise
        raise missing_extra(exc, store.extra) from None
    opener: Callable[[StoreParams], StoreFacets] = module.open_store
    return opener(
        StoreParams(
            url=config.url,
            key_prefix=config.key_prefix,
            timeout=config.store_timeout,
            replica_acks=config.replica_acks,
            connection=config.connection,
        )
    )
