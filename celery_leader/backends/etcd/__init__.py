"""etcd store: ``etcd://host1:2379,host2:2379,...`` and ``etcds://`` (TLS).

etcd replicates every write through Raft to a majority of its members before
it answers, so a claim it acknowledged survives the loss of any minority of
members, and its revision counter never goes back: the fail-over of one
member can neither roll back a claim nor hand out an epoch twice. It is spoken
to through its gRPC gateway (JSON over HTTP, etcd >= 3.4), see :mod:`.client`.

Keys of election ``e`` under key prefix ``p``:

* ``p/e/term``         - the term: JSON ``{"token", "holder", "since"}``, attached to an
  etcd lease of the ttl (rounded up to whole seconds). Created by a
  transaction that requires the key not to exist (``create_revision == 0``);
  renewed by keeping the lease alive; released by revoking the lease, which
  deletes the key. A holder that dies stops keeping it alive, and etcd deletes
  the key when the lease runs out.
* ``p/e/epoch-offset`` - normally absent. The epoch of a term is the term key's
  create revision (etcd's revision of the transaction that won it, never
  reused, always growing) plus this offset, which is only written when a
  cluster rebuilt from scratch or restored from an old snapshot would hand out
  revisions below an epoch already seen.
* ``p/e/resign``       - the term an operator asked to hand over, on the
  holder's lease, so it ends with that term.
* ``p/e/state/<entry>`` - shared schedule state, one key per entry (JSON).
* ``p/e/journal/<log>/<key>`` - a record of a journal log (the log's name
  percent-encoded), written by any process (no term); see :mod:`.journal`.

Claims are transactions that compare the term key's create revision (so they
fail once the term is over) and, per entry, the stored value (compare-and-set).
Followers wait with a watch on the term key that starts right after the
revision at which they saw it held, so a release is never missed, bounded by
the holder's remaining ttl. A member that cannot reach a majority answers
nothing: its clients' calls fail (``StoreUnavailable``) and, with no renewal,
nobody leads through it. Every read is linearizable (etcd's default): a quorum
read, never a member's possibly stale copy. The facets (:mod:`.lock`,
:mod:`.records`, :mod:`.journal`) share one :class:`.client.Cluster`.
"""

from __future__ import annotations

from .. import StoreFacets, StoreParams
from .client import Cluster
from .journal import EtcdJournal
from .lock import EtcdLock
from .params import etcd_params
from .records import EtcdEntries, EtcdRecords, EtcdRuns

__all__ = ["EtcdEntries", "EtcdJournal", "EtcdLock", "EtcdRecords", "EtcdRuns", "open_store"]


def open_store(params: StoreParams) -> StoreFacets:
    """The etcd store's facets, on one connection to the cluster ``params.url`` names
    (``replica_acks`` does not apply: etcd answers once a majority holds a write)."""
    etcd = Cluster(etcd_params(params.url), params.timeout, params.key_prefix)
    lock, records = EtcdLock(etcd, params.url), EtcdRecords(etcd)
    return StoreFacets(
        params,
        lock,
        records,
        EtcdEntries(etcd),
        EtcdRuns(etcd),
        EtcdJournal(etcd),
        etcd.close,
    )
