"""PostgreSQL store: ``postgresql://`` and ``postgres://`` (and ``django://<alias>``,
which the settings resolve to an engine and its parameters).

A term is a *session-level advisory lock* held on a dedicated connection (never
one from a pool), in autocommit mode. The lock of election ``e`` under key
prefix ``p`` has the ``bigint`` key :func:`advisory_key`: the first 8 bytes of
SHA-256 of ``"p:e"``, read as a big-endian signed integer. In ``pg_locks`` it
shows as ``locktype = 'advisory'``, ``classid`` = the high 32 bits,
``objid`` = the low 32 bits (both unsigned) and ``objsubid = 1``. Advisory
locks are per database: every instance must connect to the same one.

The server frees the lock when the session ends, so:

* a holder whose process dies (its socket closes) is replaced at once: every
  follower is queued for the lock in a blocking ``pg_advisory_lock`` on its
  own session, and PostgreSQL grants it to one of them the moment the lock is
  free;
* a holder that is paused or cut off loses it on time, because its session
  runs with ``idle_session_timeout`` = the ttl (PostgreSQL >= 14): the server
  ends a session that sent nothing for a ttl, and renewals are statements on
  that session, which restart the count. No hold-off is needed (see
  :attr:`.PostgresLock.holdoff`).

A session can also end early: a server restart or fail-over,
``pg_terminate_backend``, a missed store deadline (the backend then cuts the
connection itself). The old holder learns it at its next renewal (at most one
renew interval later), and its claims fail at once because they run on the
dead session.

Two tables (created on first use, shared by every key prefix):

* ``celery_leader_lease`` - one row per election: the epoch (bumped in the
  lock's own session on every acquisition), the current term's token JSON,
  instance id and server pid, and the token an operator asked to resign;
* ``celery_leader_state`` - shared schedule state: election, entry, JSON value.

Connection poolers in transaction or statement mode (PgBouncer with
``pool_mode = transaction``, a common production setting) break all of this: a
session lock needs the same server session for every statement. The backend
compares the server pid of every acquire and renew statement with its
session's and refuses to go on (StoreMisconfigured) when it changes; claims check
``pg_locks`` for their own session, so they fail rather than write unfenced.

The package: :mod:`.sql` and :mod:`.entries` (the statements and the lock
key), :mod:`.session` (dedicated sessions, the store deadline, a follower's
queued wait; its :class:`~.session.Connector` is the connection object the
facets share), :mod:`.params` (``leader_url`` -> libpq parameters) and
:mod:`.facets` (the lease lock, fenced records, entries, run records and the
journal on top of them).
"""

from __future__ import annotations

from .. import StoreFacets, StoreParams
from .facets import PostgresEntries, PostgresJournal, PostgresLock, PostgresRecords, PostgresRuns
from .session import Connector
from .sql import MIN_SERVER_VERSION, advisory_key

__all__ = ["MIN_SERVER_VERSION", "advisory_key", "open_store"]


def open_store(params: StoreParams) -> StoreFacets:
    """The PostgreSQL store of ``params``; it does not connect until first used."""
    db = Connector(params)
    lock, records = PostgresLock(db), PostgresRecords(db, params.replica_acks)
    return StoreFacets(
        params,
        lock,
        records,
        PostgresEntries(db),
        PostgresRuns(db),
        PostgresJournal(db),
        db.close,
    )
