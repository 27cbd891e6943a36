"""MySQL and MariaDB store: ``mysql://`` and ``mariadb://`` (and ``django://<alias>``).

A term is a named lock (``GET_LOCK``, :func:`lock_name`) held by a dedicated session
that runs with ``wait_timeout`` = the ttl; docs/stores/mysql.md has the design.
"""

from __future__ import annotations

from .. import StoreFacets, StoreParams
from ..sql_facets import sql_store
from .facets import MySqlEntries, MySqlJournal, MySqlLock, MySqlRecords, MySqlRuns
from .session import Connector
from .sql import lock_name

__all__ = ["lock_name", "open_store"]


def open_store(params: StoreParams) -> StoreFacets:
    """The MySQL / MariaDB store of ``params``; it does not connect until first used."""
    facets = MySqlLock, MySqlRecords, MySqlEntries, MySqlRuns, MySqlJournal
    return sql_store(params, Connector(params), *facets)
