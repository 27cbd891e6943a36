"""Stores. Only modules in this package talk to a store.

A store implements small interfaces, one per record kind (its *facets*):

* :class:`LeaseLock` (:mod:`.lock`): terms, holders and presence; the elector's;
* :class:`FencedRecords` (:mod:`.records`): records only the current term may
  change, written under a :class:`Fence` the caller holds;
* :class:`EntryStore` (:mod:`.entry_store`): schedule entries, versioned;
* :class:`RunStore` (:mod:`.run_store`): run records, per entry;
* :class:`Journal` (:mod:`.journal`): capped ordered logs (term history, audit trail).

A store module exports one function, ``open_store(StoreParams) -> StoreFacets``:
the facets it implements, on one connection. :data:`STORES` (in
:mod:`.registry`) is the one table of stores: the URL schemes that select each
one, its module and the extra that installs its client; :func:`open_store`
builds from it.
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
    """What :func:`open_store` reads of the settings (``LeaderConfig`` has it all).

    Spelled out here so that the store layer never imports the settings layer.
    """

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
    #: How many replicas of the store must hold a write (and a new term) before
    #: a claim (and an acquire) return it; ``None``: as many as the store's
    #: topology needs so that a promotion cannot roll it back ("auto"). Stores
    #: without replicas ignore it.
    replica_acks: int | None = None
    #: The client's connection parameters when they do not come from ``url``
    #: (``django://ALIAS``: read from Django's ``DATABASES`` by the settings);
    #: ``url`` then only names the store in messages.
    connection: Mapping[str, Any] | None = field(default=None, hash=False)


@dataclass(frozen=True, eq=False)
class StoreFacets:
    """One opened store: the facets it implements, sharing one connection.

    It does not contact the store until a facet is first used. One instance
    may serve several elections and threads.
    """

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
    """Open the store that ``config.url`` selects. It does not contact the store yet.

    A store whose client is not installed fails in one line naming its extra.
    """
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
