"""Redis store: ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``, Cluster
(``?cluster=true``).

An election's keys share the hash tag ``{<prefix>:<election>}`` (one Cluster slot);
every operation is one Lua script (:mod:`.scripts`). docs/stores/redis.md lists the
keys and the design.
"""

from __future__ import annotations

from .. import StoreFacets, StoreParams
from .acks import Replicas
from .connection import Connection
from .entries import RedisEntries
from .journal import RedisJournal
from .lock import RedisLock
from .presence import Presences
from .records import RedisRecords
from .runs import RedisRuns


def open_store(params: StoreParams) -> StoreFacets:
    """The Redis store ``params.url`` names, every facet on one connection (not yet made)."""
    conn = Connection(params)
    presences = Presences(conn)
    replicas = Replicas(params.replica_acks, params.timeout)

    def close() -> None:
        presences.close()
        conn.close()

    return StoreFacets(
        params=params,
        lock=RedisLock(conn, presences, replicas),
        records=RedisRecords(conn, replicas),
        entries=RedisEntries(conn),
        runs=RedisRuns(conn),
        journal=RedisJournal(conn),
        close=close,
    )
