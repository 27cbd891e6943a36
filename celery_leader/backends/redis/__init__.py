"""Redis store: ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``, Cluster.

Add ``?cluster=true`` to a ``redis://`` or ``rediss://`` URL for Redis Cluster.

Keys of one election share the hash tag ``{<prefix>:<election>}`` so that every
script touches a single Redis Cluster slot:

* ``{p:e}:lock``   - the term: JSON ``{"token", "epoch", "holder", "presence"}``,
  with a PX ttl
* ``{p:e}:epoch``  - counter of terms; never expires
* ``{p:e}:resign`` - the term an operator asked to hand over (``leader resign``)
* ``{p:e}:watch``  - presence id of the follower that watches the holder closely
* ``{p:e}:state``  - hash of shared schedule state, entry -> JSON
* ``{p:e}:runs``   - hash of the run ledger's marks (``@...`` keys) -> JSON
* ``{p:e}:runs-expiry`` - sorted set: when each mark expires (ms, server clock)
* ``{p:e}:run:<entry>`` - hash of one entry's run records, written by workers:
  the slot's time (the key after ``<entry>@``) -> ``<tally>|<expiry>|<record>``
  (the expiry in ms by the server's clock, base 36)
* ``{p:e}:run-order:<entry>`` - list: the same slot times, oldest created first
* ``{p:e}:run-sum:<entry>`` - hash: the entry's greatest slot kept (``last``)
  and how many kept records carry each tally (``n:<tally>``)
* ``{p:e}:run-entries`` - sorted set: entries with run records -> when their
  newest expires (the three keys above expire then too)
* ``{p:e}:entries`` - hash of schedule entries, name -> JSON; edited by any
  process (no term)
* ``{p:e}:entries-version`` - counter moved by every applied entry edit
* ``{p:e}:entries-changes`` - sorted set: each recently edited entry name -> the
  version of its edit, so a reader pays for an edit what it touched
* ``{p:e}:journal:<log>`` - hash of a journal log's records, key -> record; the
  log's name percent-encoded (``/`` kept); written by any process (no term)
* ``{p:e}:journal-keys:<log>`` - sorted set of the same keys, all scored 0, so
  that they sort by their bytes: reads are ``ZREVRANGEBYLEX`` pages, and a
  write drops the least keys over the log's cap

Releases and take-overs are announced on the channel ``{p:e}:released`` so
that followers act at once instead of waiting out the ttl. A holder whose
connection closed (its process died) is taken over without waiting for the
ttl: see :mod:`.presence`.

Every operation is one Lua script (:mod:`.scripts`); the client and the URL
forms are :mod:`.connection`'s. The facets (:mod:`.lock`, :mod:`.records`,
:mod:`.entries`, :mod:`.runs`, :mod:`.journal`) share one :class:`~.connection.Connection`.
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


__all__ = ["open_store"]
