"""etcd store: ``etcd://host1:2379,host2:2379,...`` and ``etcds://`` (TLS), through its
gRPC gateway (etcd >= 3.4).

A term is the key ``p/e/term`` on an etcd lease of the ttl; its epoch is the key's
create revision (plus ``p/e/epoch-offset``). docs/stores/etcd.md has the design.
"""

from __future__ import annotations

from .. import StoreFacets, StoreParams
from .client import Cluster
from .journal import EtcdJournal
from .lock import EtcdLock
from .params import etcd_params
from .records import EtcdEntries, EtcdRecords, EtcdRuns


def open_store(params: StoreParams) -> StoreFacets:
    """The etcd store's facets on one connection (a write is on a majority: no replica_acks)."""
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
