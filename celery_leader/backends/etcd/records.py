"""Records on etcd (fenced records, schedule entries, run records): one key per
record, compared and set in transactions."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote, unquote

from etcd3gw.client import Etcd3Client

from ...exceptions import StoreUnavailable
from ..entry_store import Edit, PagedEntryStore
from ..records import Fence, FencedRecords, Write, write_rounds
from ..run_store import RUNS_DROPPED, RunStore, RunSummary, RunWrite, run_entry
from . import wire
from .client import Cluster
from .lock import Ours

#: Entries read per range when reading them all: a few MB, so a million
#: entries never make one request that outlasts the store deadline.
ENTRIES_PAGE = 10_000

#: Fenced records read per range when reading them all (as :data:`ENTRIES_PAGE`).
RECORDS_PAGE = 10_000

#: Edit events a reader replays from etcd's history before it reads every entry
#: instead: bounds what one look reads after the reader fell far behind.
CHANGES_KEPT = 10_000

#: Edits per transaction: each compares its entry and writes it, and one more
#: write moves the version.
EDITS_PER_TXN = wire.MAX_TXN_OPS - 1

#: Bytes of entry text (expected and new) per edit transaction, well under etcd's request
#: limit (``--max-request-bytes``, 1.5 MiB by default); a larger edit goes alone.
EDIT_BYTES = 512 * 1024

#: Entries per summary page: two read-only transactions of up to 128 reads.
SUMMARIES_PAGE = 50


class EtcdRecords(FencedRecords):
    """Fenced records, ``<prefix>/<election>/state/<key>``."""

    def __init__(self, etcd: Cluster) -> None:
        #: The connection every facet of this store shares.
        self.etcd = etcd

    def load(self, election: str) -> dict[str, str]:
        # By bounded ranges at one revision: one range of a million records outlasted
        # the deadline and made etcd hold them all in memory at once.
        prefix = self.etcd.key(election, "state/")
        first = self.etcd.kv_range(prefix, wire.prefix_end(prefix), limit=RECORDS_PAGE)
        return {
            wire.name(kv, prefix): wire.text(kv)
            for page in _pages(self.etcd, prefix, first, RECORDS_PAGE)
            for kv in page
        }

    def load_some(self, election: str, keys: Sequence[str]) -> dict[str, str]:
        # Reads of single keys, as many per read-only transaction as etcd takes.
        found: dict[str, str] = {}
        with self.etcd.deadline():
            for at in range(0, len(keys), wire.MAX_TXN_OPS):
                chunk = keys[at : at + wire.MAX_TXN_OPS]
                reads = [wire.read(self.etcd.key(election, f"state/{k}")) for k in chunk]
                replies = self.etcd.txn([], reads)["responses"]
                for key, reply in zip(chunk, replies, strict=True):
                    kv = wire.kv(reply)
                    if kv is not None:
                        found[key] = wire.text(kv)
        return found

    def compare_and_set(self, fence: Fence, writes: Sequence[Write]) -> list[bool]:
        """Apply ``writes`` in transactions fenced by the term key's create revision.

        Each write is a nested transaction, so one failing does not stop the others;
        etcd refuses to write a key twice in one transaction, hence rounds."""
        results = [False] * len(writes)
        ours = Ours.of(fence.term)
        if ours is None:
            return results
        term = [wire.created_at(self.etcd.key(fence.election, "term"), ours.revision)]
        for indexes in write_rounds(writes):
            for start in range(0, len(indexes), wire.MAX_TXN_OPS):
                chunk = indexes[start : start + wire.MAX_TXN_OPS]
                ops = []
                for w in (writes[i] for i in chunk):
                    key = self.etcd.key(fence.election, f"state/{w.key}")
                    compare, put = wire.holds(key, w.expected), wire.put(key, wire.encode(w.new))
                    ops.append({"request_txn": {"compare": [compare], "success": [put]}})
                reply = self.etcd.txn(term, ops)
                if not reply.get("succeeded"):
                    return results  # the term is over: nothing more is claimed
                for i, response in zip(chunk, reply["responses"], strict=True):
                    results[i] = bool(response["response_txn"].get("succeeded"))
        return results


class EtcdEntries(PagedEntryStore):
    """Schedule entries, ``<prefix>/<election>/entries/<name>``; the version is the
    modification revision of ``<prefix>/<election>/entries-version``, which every
    edit writes in its transaction."""

    def __init__(self, etcd: Cluster) -> None:
        #: The connection every facet of this store shares.
        self.etcd = etcd

    def version(self, election: str) -> int:
        reply = self.etcd.txn([], [wire.read(self.etcd.key(election, "entries-version"))])
        return _version(reply)

    def load_one(self, election: str, name: str) -> str | None:
        reply = self.etcd.txn([], [wire.read(self.etcd.key(election, f"entries/{name}"))])
        found = wire.kv(reply["responses"][0])
        return None if found is None else wire.text(found)

    def load_pages(self, election: str) -> tuple[int, Iterator[dict[str, str]]]:
        # By bounded ranges (one range of a million entries outlasted the deadline),
        # all at the revision of the first, which read the version with it: the pages
        # are one view of the entries, exactly at that version.
        prefix = self.etcd.key(election, "entries/")
        end = wire.prefix_end(prefix)
        page = {"key": wire.b64(prefix), "range_end": wire.b64(end), "limit": ENTRIES_PAGE}
        reply = self.etcd.txn(
            [], [wire.read(self.etcd.key(election, "entries-version")), {"request_range": page}]
        )
        first = {**reply["responses"][1].get("response_range", {}), "header": reply["header"]}
        pages = (
            {wire.name(kv, prefix): wire.text(kv) for kv in kvs}
            for kvs in _pages(self.etcd, prefix, first, ENTRIES_PAGE)
        )
        return _version(reply), pages

    def changes_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        """The entries' events after ``version``, replayed from etcd's history by a watch;
        ``None`` when compacted, or after more than :data:`CHANGES_KEPT` events.

        A watch, not a range with ``min_mod_revision`` (plus tombstones of removed
        entries, which etcd does not keep): etcd filters such a range after reading
        every entry (docs/benchmarks.md), where the watch reads the revisions since
        ``version``. It covers the version key too, whose event every edit writes and
        compaction never drops (the newest of a key stays), so the replay always ends.
        Compaction does drop a removed entry's event at the compaction revision, and
        the watch does not say so when it starts there: a read at ``version`` after the
        replay tells whether etcd compacted past it."""
        with self.etcd.deadline():
            now = self.version(election)
            if now == version:
                return now, {}
            if now < version:
                return None
            prefix = self.etcd.key(election, "entries/")
            marker = self.etcd.key(election, "entries-version")
            watch = {
                # "entries-version", then "entries/...": "-" sorts before "/".
                "key": wire.b64(marker),
                "range_end": wire.b64(wire.prefix_end(prefix)),
                "start_revision": str(version + 1),
            }

            def replay(client: Etcd3Client) -> dict[str, str | None] | None:
                url = client.get_url("/watch")
                edits: dict[str, str | None] = {}
                events = 0
                with client.session.post(url, json={"create_request": watch}, stream=True) as r:
                    r.raise_for_status()
                    for line in r.iter_lines():
                        result = json.loads(line).get("result", {}) if line else {}
                        if int(result.get("compact_revision", 0)) or result.get("canceled"):
                            return None  # compacted: that history is gone
                        reached = 0
                        for event in result.get("events", []):
                            kv = event["kv"]
                            if wire.unb64(kv["key"]) == marker:
                                reached = int(kv["mod_revision"])
                                continue
                            removed = event.get("type") == "DELETE"
                            edits[wire.name(kv, prefix)] = None if removed else wire.text(kv)
                            events += 1
                        if events > CHANGES_KEPT:
                            return None
                        if reached >= now:
                            return edits  # a revision's events come in one response
                return None  # the stream ended early: read everything

            edits = self.etcd.call(replay)
            if edits is None or (version and _compacted(self.etcd, marker, version)):
                return None
        return now, edits

    def edit(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        """A transaction per :func:`_edit_chunks` chunk: compare every entry of the
        chunk, write them and the version key; a chunk whose transaction fails (an
        entry not as expected) is done again one transaction per edit, for each
        edit's own result. One round trip per edit made a bulk add of a million
        entries take half an hour (docs/benchmarks.md)."""
        version = wire.put(self.etcd.key(election, "entries-version"), b"")
        results: list[bool] = []
        for chunk in _edit_chunks(edits):
            compares, writes = [], []
            for edit in chunk:
                key = self.etcd.key(election, f"entries/{edit.key}")
                compares.append(wire.holds(key, edit.expected))
                new = edit.new
                writes.append(wire.delete(key) if new is None else wire.put(key, wire.encode(new)))
            if len(chunk) > 1 and self.etcd.txn(compares, [*writes, version]).get("succeeded"):
                results += [True] * len(chunk)
                continue
            for compare, write in zip(compares, writes, strict=True):
                reply = self.etcd.txn([compare], [write, version])
                results.append(bool(reply.get("succeeded")))
        return results


def _edit_chunks(edits: Sequence[Edit]) -> Iterator[list[Edit]]:
    """``edits`` in order, in runs that one transaction holds: no entry twice (etcd
    refuses to write a key twice in one, and the second edit must see the first),
    at most :data:`EDITS_PER_TXN` edits and :data:`EDIT_BYTES` bytes of entry text."""
    chunk: list[Edit] = []
    keys: set[str] = set()
    size = 0
    for edit in edits:
        text = sum(len(wire.encode(t)) for t in (edit.expected, edit.new) if t is not None)
        full = len(chunk) == EDITS_PER_TXN or size + text > EDIT_BYTES
        if chunk and (full or edit.key in keys):
            yield chunk
            chunk, keys, size = [], set(), 0
        chunk.append(edit)
        keys.add(edit.key)
        size += text
    if chunk:
        yield chunk


def _pages(etcd: Cluster, prefix: bytes, first: dict[str, Any], limit: int) -> Iterator[list[Any]]:
    """The key-values under ``prefix``, a range of up to ``limit`` at a time: ``first``
    (a range reply), then the ranges after it, each read when the caller asks for it,
    at ``first``'s revision (at the newest once etcd compacted that one away)."""
    end = wire.prefix_end(prefix)
    revision: int | None = int(first["header"]["revision"])
    listed = first
    while True:
        kvs = listed.get("kvs", [])
        yield kvs
        if not listed.get("more") or not kvs:
            return
        after = wire.unb64(kvs[-1]["key"]) + b"\0"
        try:
            at = {} if revision is None else {"revision": str(revision)}
            listed = etcd.kv_range(after, end, limit=limit, **at)
        except StoreUnavailable as exc:
            if revision is None or not _compaction(exc):
                raise
            revision = None  # still a view a reader can follow: the version came first
            listed = etcd.kv_range(after, end, limit=limit)


def _compacted(etcd: Cluster, key: bytes, revision: int) -> bool:
    """Whether etcd compacted its history past ``revision`` (a read of ``key`` there)."""
    try:
        etcd.kv_range(key, key + b"\0", revision=str(revision), count_only=True)
    except StoreUnavailable as exc:
        if _compaction(exc):
            return True
        raise
    return False


def _compaction(exc: StoreUnavailable) -> bool:
    """Whether etcd refused a read at a revision it compacted away."""
    return "required revision has been compacted" in str(exc)


def _version(reply: dict[str, Any]) -> int:
    """The entries version a transaction read first: 0 for entries never edited."""
    kv = wire.kv(reply["responses"][0])
    return int(kv["mod_revision"]) if kv else 0


class RunKeys:
    """An entry's run-record keys (the name percent-encoded: no prefix covers another)."""

    def __init__(self, etcd: Cluster, election: str, entry: str) -> None:
        self.entry = entry
        name = quote(entry, safe="")
        #: ``run/<entry>/<slot>``: each record, ``<tally>|<record>``.
        self.records = etcd.key(election, f"run/{name}/")
        #: ``run-last/<entry>``: the entry's greatest slot.
        self.last = etcd.key(election, f"run-last/{name}")
        #: ``run-tallies/<entry>/<tally>``: the tallies its records carry.
        self.tallies = etcd.key(election, f"run-tallies/{name}/")
        self._tally = etcd.key(election, f"run-tally/{name}/")

    def record(self, suffix: str) -> bytes:
        """The key of the record of slot ``suffix``."""
        return self.records + wire.encode(suffix)

    def tally(self, tally: str, suffix: str) -> bytes:
        """The key that counts the record of slot ``suffix`` under ``tally``."""
        return self._tally + wire.encode(f"{tally}/{suffix}")


class EtcdRuns(RunStore):
    """Run records: an entry's under :class:`RunKeys`, a mark at ``runs/<key>``."""

    def __init__(self, etcd: Cluster) -> None:
        #: The connection every facet of this store shares.
        self.etcd = etcd
        self._lock = threading.Lock()
        #: The lease run records are written with, by ttl: (lease, when to stop using
        #: it). One lease serves many records: a write is one round trip.
        self._leases: dict[float, tuple[int, float]] = {}

    def put(self, election: str, write: RunWrite) -> tuple[bool, str | None]:
        entry = run_entry(write.key)
        if entry is not None:
            return self._put_entry_run(election, entry, write)
        key = self.etcd.key(election, f"runs/{write.key}")
        put = wire.put(key, wire.encode(write.new), self._lease(write.ttl))
        reply = self.etcd.txn([wire.holds(key, write.expected)], [put], [wire.read(key)])
        if reply.get("succeeded"):
            return True, write.new
        kv = wire.kv(reply["responses"][0])
        return False, None if kv is None else wire.text(kv)

    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        start = RunKeys(self.etcd, election, entry).records
        # etcd sorts the entry's keys to answer: bounded by leader_ledger_keep.
        reply = self.etcd.kv_range(
            start, wire.prefix_end(start), limit=limit, sort_order="DESCEND", sort_target="CREATE"
        )
        return [
            (f"{entry}@{wire.name(kv, start)}", _split(wire.text(kv))[1] or "")
            for kv in reply.get("kvs", [])
        ]

    def summaries(self, election: str) -> list[RunSummary]:
        prefix = self.etcd.key(election, "run-last/")
        out: list[RunSummary] = []
        after, end = prefix, wire.prefix_end(prefix)
        while True:
            kvs = self.etcd.kv_range(after, end, limit=SUMMARIES_PAGE).get("kvs", [])
            out += self._summaries(election, [(wire.unb64(kv["key"]), wire.text(kv)) for kv in kvs])
            if len(kvs) < SUMMARIES_PAGE:
                return out
            after = wire.unb64(kvs[-1]["key"]) + b"\0"

    def _put_entry_run(self, election: str, entry: str, write: RunWrite) -> tuple[bool, str | None]:
        """An entry's record, its tally's index key and the entry's greatest slot
        (see :class:`RunKeys`), in one transaction that holds only while what it
        read is unchanged (read again otherwise)."""
        suffix = write.key[len(entry) + 1 :]
        names = RunKeys(self.etcd, election, entry)
        record, legacy = names.record(suffix), self.etcd.key(election, f"runs/{write.key}")
        while True:
            reply = self.etcd.txn([], [wire.read(record), wire.read(legacy), wire.read(names.last)])
            kv, legacy_kv, last_kv = (wire.kv(r) for r in reply["responses"])
            old_tally, current = _split(wire.text(kv)) if kv else ("", None)
            if kv is None and legacy_kv is not None:
                current = wire.text(legacy_kv)
            if current != write.expected:
                return False, current
            lease = self._lease(write.ttl)
            last = max(suffix, wire.text(last_kv) if last_kv else "")
            ops = [
                wire.put(record, wire.encode(f"{write.tally}|{write.new}"), lease),
                wire.put(names.last, last.encode(), lease),
            ]
            if kv is not None and old_tally and old_tally != write.tally:
                ops.append(wire.delete(names.tally(old_tally, suffix)))
            if write.tally:
                ops.append(wire.put(names.tally(write.tally, suffix), b"", lease))
                ops.append(wire.put(names.tallies + wire.encode(write.tally), b"", lease))
            if legacy_kv is not None:
                ops.append(wire.delete(legacy))
            compare = [
                wire.modified_at(k, v)
                for k, v in ((record, kv), (legacy, legacy_kv), (names.last, last_kv))
            ]
            if self.etcd.txn(compare, ops).get("succeeded"):
                break
        if write.keep > 0 and kv is None:
            self._trim(names, write.keep)
        return True, write.new

    def _trim(self, names: RunKeys, keep: int) -> None:
        """Drop the entry's oldest records over ``keep`` (at most RUNS_DROPPED a write)."""
        start, end = names.records, wire.prefix_end(names.records)
        count = self.etcd.kv_range(start, end, count_only=True)
        excess = min(int(count.get("count", 0)) - keep, RUNS_DROPPED)
        if excess <= 0:
            return
        oldest = self.etcd.kv_range(
            start, end, limit=excess, sort_order="ASCEND", sort_target="CREATE"
        )
        ops = []
        for kv in oldest.get("kvs", []):
            tally, _ = _split(wire.text(kv))
            ops.append(wire.delete(wire.unb64(kv["key"])))
            if tally:
                ops.append(wire.delete(names.tally(tally, wire.name(kv, start))))
        for at in range(0, len(ops), wire.MAX_TXN_OPS):
            self.etcd.txn([], ops[at : at + wire.MAX_TXN_OPS])

    def _summaries(self, election: str, lasts: list[tuple[bytes, str]]) -> list[RunSummary]:
        """The summaries of one page of ``run-last/`` keys: two transactions of reads."""
        if not lasts:
            return []
        entries = [
            RunKeys(self.etcd, election, unquote(key.rsplit(b"/", 1)[1].decode()))
            for key, _ in lasts
        ]
        reads = []
        for names, (_, last) in zip(entries, lasts, strict=True):
            reads += [wire.read(names.record(last)), wire.read_prefix(names.tallies)]
        replies = self.etcd.txn([], reads)["responses"]
        counted: list[tuple[int, str, bytes]] = []
        records: list[str | None] = []
        for i, names in enumerate(entries):
            kv = wire.kv(replies[2 * i])
            records.append(_split(wire.text(kv))[1] if kv else None)
            for t in replies[2 * i + 1].get("response_range", {}).get("kvs", []):
                tally = wire.name(t, names.tallies)
                counted.append((i, tally, names.tally(tally, "")))
        counts: list[dict[str, int]] = [{} for _ in entries]
        for at in range(0, len(counted), wire.MAX_TXN_OPS):
            chunk = counted[at : at + wire.MAX_TXN_OPS]
            ops = [wire.read_prefix(k, count_only=True) for _, _, k in chunk]
            for (i, tally, _), r in zip(chunk, self.etcd.txn([], ops)["responses"], strict=True):
                n = int(r.get("response_range", {}).get("count", 0))
                if n:
                    counts[i][tally] = n
        return [
            RunSummary(names.entry, f"{names.entry}@{last}", record, count)
            for names, (_, last), record, count in zip(entries, lasts, records, counts, strict=True)
        ]

    def _lease(self, ttl: float) -> int:
        """A lease of ``2 * ttl``, used for ``ttl``: every record lives ttl to 2 ttl."""
        now = time.monotonic()
        with self._lock:
            cached = self._leases.get(ttl)
            if cached is not None and now < cached[1]:
                return cached[0]
        lease = self.etcd.grant(2 * ttl)
        with self._lock:
            self._leases[ttl] = (lease, now + ttl)
        return lease


def _split(stored: str) -> tuple[str, str | None]:
    """A stored entry record, ``<tally>|<record>``: its tally and record."""
    tally, bar, record = stored.partition("|")
    return (tally, record) if bar else ("", None)
