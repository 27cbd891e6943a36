"""PostgreSQL store: ``postgresql://`` and ``postgres://`` (and ``django://<alias>``).

A term is a session advisory lock (key :func:`advisory_key`) held by a dedicated
session that runs with ``idle_session_timeout`` = the ttl (PostgreSQL >= 14);
docs/stores/postgres.md has the design.
"""

from __future__ import annotations

from .. import StoreFacets, StoreParams
from ..sql_facets import sql_store
from .facets import PostgresEntries, PostgresJournal, PostgresLock, PostgresRecords, PostgresRuns
from .session import Connector
from .sql import MIN_SERVER_VERSION, advisory_key

__all__ = ["MIN_SERVER_VERSION", "advisory_key", "open_store"]


def open_store(params: StoreParams) -> StoreFacets:
    """The PostgreSQL store of ``params``; it does not connect until first used."""
    facets = PostgresLock, PostgresRecords, PostgresEntries, PostgresRuns, PostgresJournal
    return sql_store(params, Connector(params), *facets)
