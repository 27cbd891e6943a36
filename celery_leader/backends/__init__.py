"""Lease stores. Only modules in this package talk to a store.

:data:`STORES` (in :mod:`.registry`) is the one table of stores: the URL
schemes that select each one, where its backend lives, and the extra that
installs its client. :mod:`celery_leader.config` validates ``leader_url``
against it, and :func:`create_backend` builds from it.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from ..election.timing import store_timeout
from ..exceptions import missing_extra
from .base import Backend
from .fenced import Edit, FencedState, Write
from .lock import Acquired, HolderInfo, LockStore, Renewal, Term
from .registry import STORES, Store, store_for


class StoreSettings(Protocol):
    """What :func:`create_backend` reads of the settings (``LeaderConfig`` has it all).

    Spelled out here so that the store layer never imports the settings layer.
    """

    @property
    def store(self) -> Store: ...
    @property
    def url(self) -> str: ...
    @property
    def key_prefix(self) -> str: ...
    @property
    def ttl(self) -> float: ...
    @property
    def renew_interval(self) -> float: ...
    @property
    def replica_acks(self) -> int | None: ...


__all__ = [
    "STORES",
    "Acquired",
    "Backend",
    "Edit",
    "FencedState",
    "HolderInfo",
    "LockStore",
    "Renewal",
    "Store",
    "StoreSettings",
    "Term",
    "Write",
    "create_backend",
    "store_for",
]


def create_backend(config: StoreSettings) -> Backend:
    """Build the backend that ``config.url`` selects. It does not contact the store yet.

    A store whose client is not installed fails in one line naming its extra.
    """
    store = config.store
    try:
        module = importlib.import_module(store.module, __name__)
    except ModuleNotFoundError as exc:
        if store.extra is None:
            raise
        raise missing_extra(exc, store.extra) from None
    backend: Backend = getattr(module, store.class_name)(
        config.url, config.key_prefix, store_timeout(config.ttl, config.renew_interval)
    )
    backend.replica_acks = config.replica_acks
    return backend
