"""The etcd backend: terms as etcd leases, epochs as revisions (see the package docstring)."""

from __future__ import annotations

import base64
import json
import math
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, unquote

from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, Etcd3Exception
from etcd3gw.lease import Lease

from ...exceptions import StoreUnavailable
from ..base import Backend
from ..fenced import RUNS_DROPPED, Edit, RunSummary, Write, run_entry, write_rounds
from ..lock import Acquired, HolderInfo, Renewal, Term
from ..terms import foreign, parse_epoch, since_of
from ..waiting import wait_sliced
from .client import NOT_FOUND, UNAVAILABLE, Cluster, b64, error_of, server_time
from .params import etcd_params

#: Entries read per range when reading them all: a few MB, so a million
#: entries never make one request that outlasts the store deadline.
ENTRIES_PAGE = 10_000

#: Edits a reader replays from etcd's history before it reads every entry
#: instead: bounds what one look reads after the reader fell far behind.
CHANGES_KEPT = 10_000

#: Claims per transaction. etcd's ``--max-txn-ops`` (128 by default) bounds
#: the operations of a transaction and of the ones nested in it together.
MAX_TXN_OPS = 64

#: Entries per summary page: two read-only transactions of up to 128 reads.
SUMMARIES_PAGE = 50

_TERM = "a celery-leader term (JSON with token and holder, on a lease)"

Op = dict[str, Any]


@dataclass(frozen=True)
class _Look:
    """The term key and the epoch offset of an election, read at one store revision."""

    term: dict[str, Any] | None  # the key-value of the term key, as the gateway gives it
    offset: int
    offset_mod: int  # mod revision of the offset key; 0 when there is none
    revision: int  # the store's revision when it was read


@dataclass(frozen=True)
class _Ours:
    """What a term handed out by this backend carries besides its epoch."""

    nonce: str
    lease: int
    revision: int  # create revision of the term key: the term's identity in etcd


class EtcdBackend(Backend):
    """Lease store on an etcd cluster (>= 3.4); see the package docstring."""

    #: The gateway's HTTP ``Date`` header: whole seconds.
    clock_resolution = 1.0

    #: No hold-off. The lease trusts a term until ``t_sent + ttl * 0.99 - 0.005``.
    #: etcd's leader frees an etcd lease no earlier than its TTL (the ttl,
    #: rounded up to whole seconds) after it *received* the grant or keep-alive,
    #: which was sent after ``t_sent``; a change of Raft leader only extends
    #: every lease (the new leader restarts their TTLs). So the old holder's
    #: belief ends first while the clocks' rates differ by less than 1 %.
    holdoff = 0.0

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        super().__init__(url, key_prefix, timeout)
        self._etcd = Cluster(etcd_params(url), timeout)
        self._lock = threading.Lock()
        #: Store revision of this backend's last look at each election's term,
        #: so that a follower's watch starts right after what it saw.
        self._seen: dict[str, int] = {}
        #: Leases of terms whose release failed; revoked by the next acquire.
        self._unreleased: set[int] = set()
        #: The etcd lease run records are written with, by their ttl: (lease,
        #: when to stop using it). One lease serves many records, so a write
        #: is one round trip, not a grant and a put.
        self._run_leases: dict[float, tuple[int, float]] = {}

    # -- the protocol ---------------------------------------------------------

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        term_key, offset_key = self._key(election, "term"), self._key(election, "epoch-offset")
        with self._etcd.deadline():
            self._revoke_unreleased()
            look = self._look(election)
            if look.term is not None:
                # Held: no lease is granted just to find that out.
                info, remaining = self._holder(election, look)
                return Acquired(None, info, min(ttl, remaining + 1.0), server_time())
            lease = self._etcd.call(lambda c: c.lease(_lease_ttl(ttl))).id
            nonce = uuid.uuid4().hex
            # etcd cannot write its own time into a value: the term's start is
            # the Date of the lease grant just answered (whole seconds).
            since = server_time() or time.time()
            value = json.dumps({"token": nonce, "holder": instance_id, "since": since})
            reply = self._txn(
                [_created_at(term_key, 0)],
                [_put(term_key, value.encode(), lease), _range(offset_key)],
                [_range(term_key), _range(offset_key)],
            )
            term, offset_kv = (_kv(r) for r in reply["responses"])
            if reply.get("succeeded"):
                revision = int(reply["header"]["revision"])
            elif term is not None and _nonce_of(term) == nonce:
                # Our own create, applied by a request that was then sent again.
                revision = int(term["create_revision"])
            else:
                self._revoke(lease)
                self._saw(election, int(reply["header"]["revision"]))
                if term is None:
                    return Acquired(None, None, 0.0, server_time())  # taken and gone: look again
                info = self._info(election, term, self._offset(offset_key, offset_kv))
                return Acquired(None, info, ttl, server_time())
            offset = self._offset(offset_key, offset_kv)
            epoch = revision + offset
            if epoch <= min_epoch:
                # The cluster's revisions are behind an epoch handed out before
                # (it was rebuilt or restored from an old snapshot): raise the
                # offset, fenced by this very term.
                raised = self._txn(
                    [_created_at(term_key, revision), _modified_at(offset_key, offset_kv)],
                    [_put(offset_key, str(min_epoch + 1 - revision).encode())],
                )
                if not raised.get("succeeded"):
                    self._revoke(lease)
                    return Acquired(None, None, 0.0, server_time())
                epoch = min_epoch + 1
        token = {
            "token": nonce,
            "epoch": epoch,
            "holder": instance_id,
            "lease": lease,
            "revision": revision,
        }
        return Acquired(Term(json.dumps(token), epoch, since), None, ttl, server_time())

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, float | None]:
        ours = _ours(term)
        if ours is None:
            return Renewal.LOST, None
        term_key = self._key(election, "term")
        with self._etcd.deadline():
            # The keep-alive restarts the lease's TTL (fixed when it was granted).
            left = self._etcd.call(lambda c: _lease_call(c, "/lease/keepalive", ours.lease))
            if left <= 0:
                return Renewal.LOST, server_time()
            # The lease lives, but is the term key still the one it created?
            reply = self._txn(
                [_created_at(term_key, ours.revision)], [_range(self._key(election, "resign"))]
            )
        now = server_time()
        if not reply.get("succeeded"):
            return Renewal.LOST, now
        resign = _kv(reply["responses"][0])
        renewal = Renewal.RESIGN if resign and _value(resign) == ours.nonce else Renewal.RENEWED
        return renewal, now

    def release(self, election: str, term: Term) -> None:
        ours = _ours(term)
        if ours is not None:
            # Revoking the lease deletes the term key (and a resign request on
            # it) in one Raft entry; followers' watches see the deletion.
            try:
                self._revoke(ours.lease)
            except StoreUnavailable:
                # Quorum lost, say: when it is back, the new Raft leader gives the
                # lease a full TTL again. Revoke it at the next call that gets
                # through instead of leaving the role empty that long.
                with self._lock:
                    self._unreleased.add(ours.lease)
                raise

    def wait(self, election: str, timeout: float, cancel: threading.Event) -> None:
        with self._lock:
            after = self._seen.get(election)
        watch = self._etcd.watch_delete(self._key(election, "term"), after)
        try:
            wait_sliced(watch.done.wait, timeout, cancel)
        finally:
            watch.close()

    def store_time(self, election: str) -> float | None:
        with self._etcd.deadline():
            self._look(election)
        return server_time()

    def holder(self, election: str) -> HolderInfo | None:
        with self._etcd.deadline():
            look = self._look(election)
            return None if look.term is None else self._holder(election, look)[0]

    def request_resign(self, election: str) -> HolderInfo | None:
        term_key = self._key(election, "term")
        with self._etcd.deadline():
            look = self._look(election)
            if look.term is None:
                return None
            info, _ = self._holder(election, look)
            # On the holder's lease, so the request ends with the term it names.
            self._txn(
                [_created_at(term_key, int(look.term["create_revision"]))],
                [
                    _put(
                        self._key(election, "resign"),
                        _nonce_of(look.term).encode(),
                        int(look.term["lease"]),
                    )
                ],
            )
        return info

    def elections(self) -> list[str]:
        # One key per election, skipping to the next election's keys: reading
        # every key (a run ledger holds two a record) took seconds at 200,000.
        names: list[str] = []
        start = f"{self.key_prefix}/".encode()
        end = _prefix_end(start)
        while True:
            kvs = self._range_page(start, end, 1, keys_only=True).get("kvs", [])
            if not kvs:
                return names
            key = _bytes(kvs[0]["key"])
            parts = key.split(b"/")
            if len(parts) < 3:
                start = key + b"\0"
                continue
            names.append(parts[1].decode())
            start = _prefix_end(f"{self.key_prefix}/{names[-1]}/".encode())

    def load_state(self, election: str) -> dict[str, str]:
        prefix = self._key(election, "state/")
        return {
            key[len(prefix) :].decode(): value.decode("utf-8", "surrogateescape")
            for key, value in self._range_prefix(prefix)
        }

    def compare_and_set(self, election: str, term: Term, claims: Sequence[Write]) -> list[bool]:
        """Apply ``claims`` in transactions fenced by the term key's create revision.

        Each claim is a nested transaction (compare its entry's value, then
        put), so one claim failing does not stop the others. etcd compares
        every nested transaction before applying any, and refuses to write a
        key twice in one transaction, so the n-th claim of an entry goes in
        round n; a round is one transaction of up to :data:`MAX_TXN_OPS` claims.
        """
        results = [False] * len(claims)
        ours = _ours(term)
        if ours is None:
            return results
        fence = [_created_at(self._key(election, "term"), ours.revision)]
        for indexes in write_rounds(claims):
            for start in range(0, len(indexes), MAX_TXN_OPS):
                chunk = indexes[start : start + MAX_TXN_OPS]
                reply = self._txn(fence, [self._claim_op(election, claims[i]) for i in chunk])
                if not reply.get("succeeded"):
                    return results  # the term is over: nothing more is claimed
                for i, response in zip(chunk, reply["responses"], strict=True):
                    results[i] = bool(response["response_txn"].get("succeeded"))
        return results

    def put_run(
        self,
        election: str,
        key: str,
        expected: str | None,
        new: str,
        ttl: float,
        *,
        keep: int = 0,
        tally: str = "",
    ) -> tuple[bool, str | None]:
        entry = run_entry(key)
        if entry is not None:
            return self._put_entry_run(election, entry, key, expected, new, ttl, keep, tally)
        run_key = self._key(election, f"runs/{key}")
        if expected is None:
            compare = _created_at(run_key, 0)
        else:
            compare = {
                "key": b64(run_key),
                "target": "VALUE",
                "result": "EQUAL",
                "value": b64(_encode(expected)),
            }
        put = _put(run_key, _encode(new), self._run_lease(ttl))
        reply = self._txn([compare], [put], [_range(run_key)])
        if reply.get("succeeded"):
            return True, new
        kv = _kv(reply["responses"][0])
        return False, None if kv is None else _value(kv)

    def _put_entry_run(
        self,
        election: str,
        entry: str,
        key: str,
        expected: str | None,
        new: str,
        ttl: float,
        keep: int,
        tally: str,
    ) -> tuple[bool, str | None]:
        """An entry's record (``run/<entry>/<slot time>``, ``<tally>|<record>``), its
        tally's index key (``tally/<entry>/<tally>/<slot time>``: a summary counts
        them) and the entry's greatest slot (``last/<entry>``), in one transaction
        that holds only while what it read is unchanged (read again otherwise)."""
        suffix = key[len(entry) + 1 :]
        names = _RunKeys(self, election, entry)
        record, legacy = names.record(suffix), self._key(election, f"runs/{key}")
        while True:
            reply = self._txn([], [_range(record), _range(legacy), _range(names.last)])
            kv, legacy_kv, last_kv = (_kv(r) for r in reply["responses"])
            old_tally, current = _split(_value(kv)) if kv else ("", None)
            if kv is None and legacy_kv is not None:
                current = _value(legacy_kv)
            if current != expected:
                return False, current
            lease = self._run_lease(ttl)
            last = max(suffix, _value(last_kv) if last_kv else "")
            ops = [
                _put(record, _encode(f"{tally}|{new}"), lease),
                _put(names.last, last.encode(), lease),
            ]
            if kv is not None and old_tally and old_tally != tally:
                ops.append(_delete(names.tally(old_tally, suffix)))
            if tally:
                ops += [_put(names.tally(tally, suffix), b"", lease)]
                ops += [_put(names.tallies + _encode(tally), b"", lease)]
            if legacy_kv is not None:
                ops.append(_delete(legacy))
            compare = [
                _modified_at(k, v)
                for k, v in ((record, kv), (legacy, legacy_kv), (names.last, last_kv))
            ]
            if self._txn(compare, ops).get("succeeded"):
                break
        if keep > 0 and kv is None:
            self._trim(names, keep)
        return True, new

    def _trim(self, names: _RunKeys, keep: int) -> None:
        """Drop the entry's oldest records over ``keep`` (at most RUNS_DROPPED a write)."""
        start, end = names.records, _prefix_end(names.records)
        count = self._etcd.call(
            lambda c: c.post(
                c.get_url("/kv/range"),
                json={"key": b64(start), "range_end": b64(end), "count_only": True},
            )
        )
        excess = min(int(count.get("count", 0)) - keep, RUNS_DROPPED)
        if excess <= 0:
            return
        oldest = self._range_sorted(start, end, "ASCEND", excess)  # by creation
        ops = []
        for kv in oldest:
            full = _bytes(kv["key"])
            tally, _ = _split(_value(kv))
            ops.append(_delete(full))
            if tally:
                ops.append(_delete(names.tally(tally, full[len(start) :].decode())))
        for at in range(0, len(ops), MAX_TXN_OPS):
            self._txn([], ops[at : at + MAX_TXN_OPS])

    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        names = _RunKeys(self, election, entry)
        start = names.records
        # etcd sorts the entry's keys to answer: bounded by leader_ledger_keep.
        kvs = self._range_sorted(start, _prefix_end(start), "DESCEND", limit)
        out = []
        for kv in kvs:
            _, record = _split(_value(kv))
            out.append((f"{entry}@{_bytes(kv['key'])[len(start) :].decode()}", record or ""))
        return out

    def run_summaries(self, election: str) -> list[RunSummary]:
        prefix = self._key(election, "run-last/")
        out: list[RunSummary] = []
        after = prefix
        while True:
            page = self._range_page(after, _prefix_end(prefix), SUMMARIES_PAGE)
            kvs = page.get("kvs", [])
            out += self._summaries(election, [(_bytes(kv["key"]), _value(kv)) for kv in kvs])
            if len(kvs) < SUMMARIES_PAGE:
                return out
            after = _bytes(kvs[-1]["key"]) + b"\0"

    def _summaries(self, election: str, lasts: list[tuple[bytes, str]]) -> list[RunSummary]:
        """The summaries of one page of ``run-last/`` keys: two transactions of reads."""
        if not lasts:
            return []
        entries = [
            _RunKeys(self, election, unquote(key.rsplit(b"/", 1)[1].decode()))
            for key, _ in lasts
        ]
        reads = []
        for names, (_, last) in zip(entries, lasts, strict=True):
            reads += [_range(names.record(last)), _range_of(names.tallies)]
        replies = self._txn([], reads)["responses"]
        counted: list[tuple[int, str, bytes]] = []
        records: list[str | None] = []
        for i, names in enumerate(entries):
            kv = _kv(replies[2 * i])
            records.append(_split(_value(kv))[1] if kv else None)
            for t in replies[2 * i + 1].get("response_range", {}).get("kvs", []):
                tally = _bytes(t["key"])[len(names.tallies) :].decode()
                counted.append((i, tally, names.tally(tally, "")))
        counts: list[dict[str, int]] = [{} for _ in entries]
        for at in range(0, len(counted), MAX_TXN_OPS):
            chunk = counted[at : at + MAX_TXN_OPS]
            ops = [_range_of(k, count_only=True) for _, _, k in chunk]
            for (i, tally, _), r in zip(chunk, self._txn([], ops)["responses"], strict=True):
                n = int(r.get("response_range", {}).get("count", 0))
                if n:
                    counts[i][tally] = n
        return [
            RunSummary(names.entry, f"{names.entry}@{last}", record, count)
            for names, (_, last), record, count in zip(
                entries, lasts, records, counts, strict=True
            )
        ]

    def _range_page(self, start: bytes, end: bytes, limit: int, keys_only: bool = False) -> Any:
        body = {"key": b64(start), "range_end": b64(end), "limit": limit, "keys_only": keys_only}
        return self._etcd.call(lambda c: c.post(c.get_url("/kv/range"), json=body))

    def _range_sorted(self, start: bytes, end: bytes, order: str, limit: int) -> list[Any]:
        """Up to ``limit`` keys of ``[start, end)``, by the order they were created."""
        body = {
            "key": b64(start),
            "range_end": b64(end),
            "limit": limit,
            "sort_order": order,
            "sort_target": "CREATE",
        }
        reply = self._etcd.call(lambda c: c.post(c.get_url("/kv/range"), json=body))
        return list(reply.get("kvs", []))

    def _run_lease(self, ttl: float) -> int:
        """A lease of ``2 * ttl``, used for ``ttl``: every record lives ttl to 2 ttl."""
        now = time.monotonic()
        with self._lock:
            cached = self._run_leases.get(ttl)
            if cached is not None and now < cached[1]:
                return cached[0]
        lease = int(self._etcd.call(lambda c: c.lease(_lease_ttl(2 * ttl))).id)
        with self._lock:
            self._run_leases[ttl] = (lease, now + ttl)
        return lease
    def entries_version(self, election: str) -> int:
        reply = self._txn([], [_range(self._key(election, "entries-version"))])
        kv = _kv(reply["responses"][0])
        return int(kv["mod_revision"]) if kv else 0

    def load_entries(self, election: str) -> tuple[int, dict[str, str]]:
        # By bounded ranges: one range of a million entries outlasted the store
        # deadline. The version comes with the first page: an edit during the
        # pages moves it past the one returned, and the reader asks again.
        prefix = self._key(election, "entries/")
        end = b64(_prefix_end(prefix))
        page = {"key": b64(prefix), "range_end": end, "limit": ENTRIES_PAGE}
        reply = self._txn(
            [], [_range(self._key(election, "entries-version")), {"request_range": page}]
        )
        kv = _kv(reply["responses"][0])
        version = int(kv["mod_revision"]) if kv else 0
        listed = reply["responses"][1].get("response_range", {})
        entries: dict[str, str] = {}
        while True:
            kvs = listed.get("kvs", [])
            entries.update((_bytes(e["key"])[len(prefix) :].decode(), _value(e)) for e in kvs)
            if not listed.get("more") or not kvs:
                return version, entries
            after = b64(_bytes(kvs[-1]["key"]) + b"\0")
            body: dict[str, Any] = {"key": after, "range_end": end, "limit": ENTRIES_PAGE}

            def more(client: Etcd3Client, body: dict[str, Any] = body) -> Any:
                return client.post(client.get_url("/kv/range"), json=body)

            listed = self._etcd.call(more)

    def entries_changed_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        """The entries' events after ``version``, replayed from etcd's history by a watch.

        Every edit is one transaction that writes one entry key and the version
        key, so the event at the version read first is the last one to take.
        ``None`` when etcd compacted that history, or it holds more edits than
        :data:`CHANGES_KEPT`.
        """
        with self._etcd.deadline():
            now = self.entries_version(election)
            if now == version:
                return now, {}
            if now < version:
                return None
            prefix = self._key(election, "entries/")
            watch = {
                "key": b64(prefix),
                "range_end": b64(_prefix_end(prefix)),
                "start_revision": str(version + 1),
            }

            def replay(client: Etcd3Client) -> dict[str, str | None] | None:
                url = client.get_url("/watch")
                edits: dict[str, str | None] = {}
                with client.session.post(url, json={"create_request": watch}, stream=True) as r:
                    r.raise_for_status()
                    for line in r.iter_lines():
                        result = json.loads(line).get("result", {}) if line else {}
                        if int(result.get("compact_revision", 0)) or result.get("canceled"):
                            return None  # compacted: that history is gone
                        for event in result.get("events", []):
                            kv = event["kv"]
                            name = _bytes(kv["key"])[len(prefix) :].decode()
                            removed = event.get("type") == "DELETE"
                            edits[name] = None if removed else _value(kv)
                            if int(kv["mod_revision"]) >= now:
                                return edits
                            if len(edits) > CHANGES_KEPT:
                                return None
                return None  # the stream ended early: read everything

            edits = self._etcd.call(replay)
        return None if edits is None else (now, edits)

    def edit_entries(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        """One transaction per edit: compare the entry, write it and the version key.

        The version is the version key's modification revision, so it moves with
        every applied edit and with nothing else.
        """
        version = _put(self._key(election, "entries-version"), b"")
        results = []
        for edit in edits:
            key = self._key(election, f"entries/{edit.key}")
            if edit.expected is None:
                compare = _created_at(key, 0)
            else:
                value = b64(edit.expected.encode("utf-8", "surrogateescape"))
                compare = {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": value}
            if edit.new is None:
                write: Op = {"request_delete_range": {"key": b64(key)}}
            else:
                write = _put(key, edit.new.encode("utf-8", "surrogateescape"))
            reply = self._txn([compare], [write, version])
            results.append(bool(reply.get("succeeded")))
        return results

    def leave(self, election: str) -> None:
        with self._lock:
            self._seen.pop(election, None)

    def close(self) -> None:
        self._etcd.close()

    # -- helpers ------------------------------------------------------------

    def _key(self, election: str, name: str) -> bytes:
        return f"{self.key_prefix}/{election}/{name}".encode()

    def _txn(self, compare: list[Op], success: list[Op], failure: Sequence[Op] = ()) -> Any:
        body = {"compare": compare, "success": success, "failure": list(failure)}
        return self._etcd.call(lambda c: c.transaction(body))

    def _look(self, election: str) -> _Look:
        offset_key = self._key(election, "epoch-offset")
        reply = self._txn([], [_range(self._key(election, "term")), _range(offset_key)])
        term, offset_kv = (_kv(r) for r in reply["responses"])
        revision = int(reply["header"]["revision"])
        self._saw(election, revision)
        offset = self._offset(offset_key, offset_kv)
        mod = int(offset_kv["mod_revision"]) if offset_kv else 0
        return _Look(term, offset, mod, revision)

    def _saw(self, election: str, revision: int) -> None:
        with self._lock:
            self._seen[election] = revision

    def _holder(self, election: str, look: _Look) -> tuple[HolderInfo, float]:
        """The holder in ``look``, with its lease's remaining whole seconds (one call)."""
        assert look.term is not None
        info = self._info(election, look.term, look.offset)
        lease = int(look.term["lease"])
        # etcd truncates to whole seconds: the true time left is below this + 1.
        remaining = float(
            max(0, self._etcd.call(lambda c: _lease_call(c, "/kv/lease/timetolive", lease)))
        )
        return replace(info, ttl_remaining=remaining), remaining

    def _info(self, election: str, term: dict[str, Any], offset: int) -> HolderInfo:
        where = f"etcd key {self._key(election, 'term').decode()!r}"
        text = _value(term)
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("token"), str)
            or not isinstance(data.get("holder"), str)
            or "lease" not in term
        ):
            raise foreign(where, text, _TERM)
        epoch = int(term["create_revision"]) + offset
        return HolderInfo(data["holder"], epoch, None, since=since_of(data))

    def _offset(self, key: bytes, kv: dict[str, Any] | None) -> int:
        return 0 if kv is None else parse_epoch(_value(kv), f"etcd key {key.decode()!r}")

    def _revoke_unreleased(self) -> None:
        with self._lock:
            leases = list(self._unreleased)
        for lease in leases:
            self._revoke(lease)
            with self._lock:
                self._unreleased.discard(lease)

    def _revoke(self, lease: int) -> None:
        def revoke(client: Etcd3Client) -> None:
            try:
                Lease(lease, client).revoke()
            except Etcd3Exception as exc:
                if error_of(exc)[0] != NOT_FOUND:
                    raise  # "not found": expired or revoked already, which is the goal

        self._etcd.call(revoke)

    def _claim_op(self, election: str, claim: Write) -> Op:
        key = self._key(election, f"state/{claim.key}")
        if claim.expected is None:
            compare = _created_at(key, 0)
        else:
            compare = {
                "key": b64(key),
                "target": "VALUE",
                "result": "EQUAL",
                "value": b64(claim.expected.encode("utf-8", "surrogateescape")),
            }
        put = _put(key, claim.new.encode("utf-8", "surrogateescape"))
        return {"request_txn": {"compare": [compare], "success": [put]}}

    def _range_prefix(self, prefix: bytes, keys_only: bool = False) -> list[tuple[bytes, bytes]]:
        body = {"key": b64(prefix), "range_end": b64(_prefix_end(prefix)), "keys_only": keys_only}
        reply = self._etcd.call(lambda c: c.post(c.get_url("/kv/range"), json=body))
        return [(_bytes(kv["key"]), _bytes(kv.get("value", ""))) for kv in reply.get("kvs", [])]


# -- request and reply pieces ---------------------------------------------------


def _lease_ttl(ttl: float) -> int:
    """etcd leases count whole seconds: round up, so the store never frees a term early."""
    return max(1, math.ceil(ttl))


def _lease_call(client: Etcd3Client, path: str, lease: int) -> int:
    """The TTL left on ``lease`` after a keep-alive or time-to-live call; <= 0 when gone.

    The gateway reports errors of the streaming keep-alive as a body with
    ``error`` and status 200: they are raised here like any other.
    """
    reply = client.post(client.get_url(path), json={"ID": str(lease)})
    error = reply.get("error")
    if error is not None:
        # Unavailable (no Raft leader there): another member may do, as for a 503.
        unavailable = error.get("grpc_code") == UNAVAILABLE
        raise (ConnectionFailedError if unavailable else Etcd3Exception)(json.dumps(error))
    return int(reply.get("result", reply).get("TTL", -1))


def _range(key: bytes) -> Op:
    return {"request_range": {"key": b64(key)}}


def _range_of(prefix: bytes, count_only: bool = False) -> Op:
    """Every key starting with ``prefix`` (only how many, with ``count_only``)."""
    body = {"key": b64(prefix), "range_end": b64(_prefix_end(prefix)), "count_only": count_only}
    return {"request_range": body}


def _delete(key: bytes) -> Op:
    return {"request_delete_range": {"key": b64(key)}}


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _split(stored: str) -> tuple[str, str | None]:
    """A stored entry record, ``<tally>|<record>``: its tally and record."""
    tally, bar, record = stored.partition("|")
    return (tally, record) if bar else ("", None)


class _RunKeys:
    """The keys of one entry's run records (the entry name percent-encoded, so
    that one entry's prefix never covers another's)."""

    def __init__(self, backend: EtcdBackend, election: str, entry: str) -> None:
        self.entry = entry
        name = quote(entry, safe="")
        self.records = backend._key(election, f"run/{name}/")
        self.last = backend._key(election, f"run-last/{name}")
        self.tallies = backend._key(election, f"run-tallies/{name}/")
        self._tally = backend._key(election, f"run-tally/{name}/")

    def record(self, suffix: str) -> bytes:
        return self.records + _encode(suffix)

    def tally(self, tally: str, suffix: str) -> bytes:
        return self._tally + _encode(f"{tally}/{suffix}")


def _put(key: bytes, value: bytes, lease: int | None = None) -> Op:
    put: Op = {"key": b64(key), "value": b64(value)}
    if lease is not None:
        put["lease"] = str(lease)
    return {"request_put": put}


def _created_at(key: bytes, revision: int) -> Op:
    """Compare: ``key`` was created at ``revision`` (0: it does not exist)."""
    return {
        "key": b64(key),
        "target": "CREATE",
        "result": "EQUAL",
        "create_revision": str(revision),
    }


def _modified_at(key: bytes, kv: dict[str, Any] | None) -> Op:
    """Compare: ``key`` is as it was read (``kv``; ``None`` when it did not exist)."""
    mod = int(kv["mod_revision"]) if kv else 0
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod)}


def _kv(response: dict[str, Any]) -> dict[str, Any] | None:
    kvs = response.get("response_range", {}).get("kvs")
    return kvs[0] if kvs else None


def _bytes(text: str) -> bytes:
    return base64.b64decode(text)


def _value(kv: dict[str, Any]) -> str:
    return _bytes(kv.get("value", "")).decode("utf-8", "surrogateescape")


def _nonce_of(term: dict[str, Any]) -> str:
    try:
        data = json.loads(_value(term))
    except ValueError:
        return ""
    return str(data.get("token", "")) if isinstance(data, dict) else ""


def _ours(term: Term) -> _Ours | None:
    """The etcd side of a term this backend handed out; ``None`` for any other."""
    try:
        data = json.loads(term.token)
        return _Ours(str(data["token"]), int(data["lease"]), int(data["revision"]))
    except (ValueError, KeyError, TypeError):
        return None


def _prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with ``prefix`` (which ends in "/")."""
    return prefix[:-1] + bytes([prefix[-1] + 1])
