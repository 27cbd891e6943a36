"""The journal on etcd: one key per record, ``<prefix>/<election>/journal/<log>/<key>``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from ..journal import Journal, JournalWrite, journal_rounds
from . import wire
from .client import Cluster


class EtcdJournal(Journal):
    """Journal logs; a log's keys sort as its records' keys do (etcd orders keys
    by their bytes), so a page is one range read, greatest first."""

    def __init__(self, etcd: Cluster) -> None:
        #: The connection every facet of this store shares.
        self.etcd = etcd

    def _prefix(self, election: str, log: str) -> bytes:
        """Where ``log``'s records are: its name percent-encoded, slashes too, so
        that no log's prefix covers another's."""
        return self.etcd.key(election, f"journal/{quote(log, safe='')}/")

    def write(self, election: str, writes: Sequence[JournalWrite]) -> None:
        """Apply ``writes`` as they would be one by one: a round per
        :func:`journal_rounds` (one for the term history's and the audit trail's calls)."""
        with self.etcd.deadline():
            for batch in journal_rounds(writes):
                runs: dict[str, list[JournalWrite]] = {}
                for w in batch:
                    runs.setdefault(w.log, []).append(w)
                self._round(election, list(runs.values()))

    def _round(self, election: str, runs: list[list[JournalWrite]]) -> None:
        """Put the records of ``runs`` (one per log, of one ``keep`` each), and read
        how many keys each log has now and its least ones, in one transaction
        (etcd refuses to write a key twice in one: the last write of a key is
        the one made); then drop, in one more, the keys of the logs that went
        over their cap."""
        last = {(w.log, w.key): w for run in runs for w in run}
        puts = [
            wire.put(self._prefix(election, w.log) + wire.encode(w.key), wire.encode(w.data))
            for w in last.values()
        ]
        # The least keys, as many as the run adds: those a full log drops.
        added = Counter(log for log, _ in last)
        peeks = [
            self._range(election, run[0].log, keys_only=True, limit=added[run[0].log])
            for run in runs
        ]
        found = self._transactions(puts + peeks)[len(puts) :]
        drops = []
        for run, reply in zip(runs, found, strict=True):
            log = run[0].log
            drop = self._cutoff(election, log, run[0].keep, reply.get("response_range", {}))
            if drop is not None:
                drops.append(wire.delete_range(self._prefix(election, log), drop))
        self._transactions(drops)

    def read(
        self, election: str, log: str, limit: int, before: str | None = None
    ) -> list[tuple[str, str]]:
        if limit <= 0:
            return []  # etcd reads a limit of 0 as none
        start = self._prefix(election, log)
        end = wire.prefix_end(start) if before is None else start + wire.encode(before)
        # etcd sorts the log's keys to answer: bounded by the log's cap.
        reply = self.etcd.kv_range(start, end, limit=limit, sort_order="DESCEND", sort_target="KEY")
        return [(wire.name(kv, start), wire.text(kv)) for kv in reply.get("kvs", [])]

    def _range(self, election: str, log: str, **options: Any) -> wire.Op:
        """A range read of ``log``'s keys in a transaction (``options`` as the gateway
        names them)."""
        start = self._prefix(election, log)
        body = {"key": wire.b64(start), "range_end": wire.b64(wire.prefix_end(start)), **options}
        return {"request_range": body}

    def _cutoff(self, election: str, log: str, keep: int, found: dict[str, Any]) -> bytes | None:
        """The end of the keys ``log`` drops to keep ``keep`` (``found``: how many
        it has and its least keys); ``None`` when it drops none."""
        excess = int(found.get("count", 0)) - keep
        if excess <= 0:
            return None
        kvs = found.get("kvs", [])
        if excess > len(kvs):  # the cap was lowered: read as many as it drops
            start = self._prefix(election, log)
            listed = self.etcd.kv_range(start, wire.prefix_end(start), keys_only=True, limit=excess)
            kvs = listed.get("kvs", [])
        if not kvs:
            return None
        return wire.unb64(kvs[min(excess, len(kvs)) - 1]["key"]) + b"\0"

    def _transactions(self, ops: list[wire.Op]) -> list[dict[str, Any]]:
        """The responses of ``ops``, in transactions of up to MAX_TXN_OPS."""
        responses: list[dict[str, Any]] = []
        for at in range(0, len(ops), wire.MAX_TXN_OPS):
            reply = self.etcd.txn([], ops[at : at + wire.MAX_TXN_OPS])
            responses += reply.get("responses", [])
        return responses
