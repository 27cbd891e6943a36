"""MySQL and MariaDB store: ``mysql://`` and ``mariadb://`` (and ``django://<alias>``,
which the settings resolve to an engine and its parameters).

A term is a *named lock* (``GET_LOCK``) held on a dedicated connection (never
one from a pool), in autocommit mode. The lock of election ``e`` under key
prefix ``p`` in database ``d`` is named ``"p:e@d"`` (:func:`lock_name`; names
over 64 characters, MySQL's limit, are hashed, and the lease table keeps the
readable one). It shows in ``performance_schema.metadata_locks`` (MySQL) or
``information_schema.metadata_lock_info`` (MariaDB's plugin).

The server frees the lock when the session ends, so:

* a holder whose process dies (its socket closes) is replaced at once: every
  follower is queued for the lock in a blocking ``GET_LOCK`` on its own
  session, and the server grants it to one of them the moment it is free;
* a holder that is paused or cut off loses it on time, because its session
  runs with ``wait_timeout`` = the ttl, rounded up to whole seconds: the server
  ends a session that sent nothing for that long, and renewals are
  statements on that session, which restart the count. No hold-off is needed
  (see :attr:`.MySqlLock.holdoff`).

A session can also end early: a server restart, ``KILL``, a missed store
deadline (PyMySQL's read timeout closes the connection). The old holder learns
it at its next renewal (at most one renew interval later), and its claims fail
at once because they run on the dead session.

Two tables (created on first use, shared by every key prefix):

* ``celery_leader_lease`` - one row per election: the epoch (bumped in the
  lock's own session on every acquisition), the lock name, the current term's
  token JSON, instance id and server connection id, and the token an
  operator asked to resign;
* ``celery_leader_state`` - the fenced records: election, key, value.

Named locks live in one server's memory and are not replicated: under Galera
or group replication two nodes would each grant the same lock, so such
servers are refused (StoreMisconfigured). A proxy that multiplexes
connections (ProxySQL) breaks the session lock the same way a transaction
pooler breaks PostgreSQL's: the store compares ``CONNECTION_ID()`` of every
acquire and renew statement with its session's and refuses to go on.

The package: :mod:`.sql` and :mod:`.entries` (the statements and the lock
name), :mod:`.session` (dedicated sessions, the store deadline, a follower's
queued wait; its :class:`~.session.Connector` is the connection object the
facets share), :mod:`.params` (``leader_url`` -> PyMySQL parameters) and
:mod:`.facets` (the lease lock, fenced records, entries, run records and the
journal on top of them).
"""

from __future__ import annotations

from .. import StoreFacets, StoreParams
from .facets import MySqlEntries, MySqlJournal, MySqlLock, MySqlRecords, MySqlRuns
from .session import Connector
from .sql import lock_name

__all__ = ["lock_name", "open_store"]


def open_store(params: StoreParams) -> StoreFacets:
    """The MySQL / MariaDB store of ``params``; it does not connect until first used."""
    db = Connector(params)
    lock, records = MySqlLock(db), MySqlRecords(db, params.replica_acks)
    return StoreFacets(
        params, lock, records, MySqlEntries(db), MySqlRuns(db), MySqlJournal(db), db.close
    )
