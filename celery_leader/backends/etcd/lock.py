"""The etcd lease lock: a term is an etcd lease, won by creating the term key on it."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, Etcd3Exception
from etcd3gw.lease import Lease

from ...exceptions import StoreUnavailable
from ..lock import Acquired, HolderInfo, LeaseLock, Renewal, Term
from ..terms import foreign, parse_epoch, since_of
from ..waiting import wait_sliced
from . import wire
from .client import NOT_FOUND, UNAVAILABLE, Cluster, error_of, server_time

_TERM = "a celery-leader term (JSON with token and holder, on a lease)"


@dataclass(frozen=True)
class Ours:
    """What a term handed out by :class:`EtcdLock` carries besides its epoch."""

    nonce: str
    lease: int
    #: Create revision of the term key: the term's identity in etcd, which
    #: fences every write of the term.
    revision: int

    @staticmethod
    def of(term: Term) -> Ours | None:
        """The etcd side of ``term``; ``None`` for a term this store did not hand out."""
        try:
            data = json.loads(term.token)
            return Ours(str(data["token"]), int(data["lease"]), int(data["revision"]))
        except (ValueError, KeyError, TypeError):
            return None


class EtcdLock(LeaseLock):
    """Terms on an etcd cluster (>= 3.4); see the package docstring."""

    #: The gateway's HTTP ``Date`` header: whole seconds.
    clock_resolution = 1.0

    #: No hold-off: etcd frees a lease no earlier than its TTL (the ttl rounded up)
    #: after it received the grant or keep-alive, sent after ``t_sent``; a new Raft
    #: leader only extends leases. The old holder's belief (``t_sent + ttl * 0.99``) ends first.
    holdoff = 0.0

    def __init__(self, etcd: Cluster, url: str) -> None:
        #: The connection every facet of this store shares.
        self.etcd = etcd
        self.url, self.timeout = url, etcd.timeout
        self._lock = threading.Lock()
        #: Store revision of this process's last look at each election's term,
        #: so that a follower's watch starts right after what it saw.
        self._seen: dict[str, int] = {}
        #: Leases of terms whose release failed; revoked by the next acquire.
        self._unreleased: set[int] = set()

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        term_key, offset_key = (self.etcd.key(election, k) for k in ("term", "epoch-offset"))
        with self.etcd.deadline():
            self._revoke_unreleased()
            held, offset = self._look(election)
            if held is not None:
                # Held: no lease is granted just to find that out.
                info = self._holder(election, held, offset)
                retry = min(ttl, (info.ttl_remaining or 0.0) + 1.0)
                return Acquired(None, info, retry, server_time())
            lease = self.etcd.grant(ttl)
            nonce = uuid.uuid4().hex
            # etcd cannot write its own time into a value: the term's start is
            # the Date of the lease grant just answered (whole seconds).
            since = server_time() or time.time()
            value = json.dumps({"token": nonce, "holder": instance_id, "since": since})
            reply = self.etcd.txn(
                [wire.created_at(term_key, 0)],
                [wire.put(term_key, value.encode(), lease), wire.read(offset_key)],
                [wire.read(term_key), wire.read(offset_key)],
            )
            term, offset_kv = (wire.kv(r) for r in reply["responses"])
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
            epoch = revision + self._offset(offset_key, offset_kv)
            if epoch <= min_epoch:
                # The cluster's revisions are behind an epoch handed out before
                # (it was rebuilt or restored from an old snapshot): raise the
                # offset, fenced by this very term.
                raised = self.etcd.txn(
                    [wire.created_at(term_key, revision), wire.modified_at(offset_key, offset_kv)],
                    [wire.put(offset_key, str(min_epoch + 1 - revision).encode())],
                )
                if not raised.get("succeeded"):
                    self._revoke(lease)
                    return Acquired(None, None, 0.0, server_time())
                epoch = min_epoch + 1
        token = dict(token=nonce, epoch=epoch, holder=instance_id, lease=lease, revision=revision)
        return Acquired(Term(json.dumps(token), epoch, since), None, ttl, server_time())

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, float | None]:
        ours = Ours.of(term)
        if ours is None:
            return Renewal.LOST, None
        with self.etcd.deadline():
            # The keep-alive restarts the lease's TTL (fixed when it was granted).
            left = self.etcd.call(lambda c: _lease_call(c, "/lease/keepalive", ours.lease))
            if left <= 0:
                return Renewal.LOST, server_time()
            # The lease lives, but is the term key still the one it created?
            reply = self.etcd.txn(
                [wire.created_at(self.etcd.key(election, "term"), ours.revision)],
                [wire.read(self.etcd.key(election, "resign"))],
            )
        now = server_time()
        if not reply.get("succeeded"):
            return Renewal.LOST, now
        resign = wire.kv(reply["responses"][0])
        asked = resign is not None and wire.text(resign) == ours.nonce
        return (Renewal.RESIGN if asked else Renewal.RENEWED), now

    def release(self, election: str, term: Term | None) -> None:
        ours = None if term is None else Ours.of(term)
        if term is None:
            with self._lock:
                self._seen.pop(election, None)
        elif ours is not None:
            # Revoking the lease deletes the term key (and a resign request on
            # it) in one Raft entry; followers' watches see the deletion.
            try:
                self._revoke(ours.lease)
            except StoreUnavailable:
                # Quorum lost, say: the new Raft leader would give the lease a full TTL
                # again, so revoke it at the next call that gets through.
                with self._lock:
                    self._unreleased.add(ours.lease)
                raise

    def _wait_free(self, election: str, timeout: float, cancel: threading.Event) -> None:
        # A holder just waits: its term is its lease, which only runs out.
        with self._lock:
            after = self._seen.get(election)
        watch = self.etcd.watch_delete(self.etcd.key(election, "term"), after)
        try:
            wait_sliced(watch.done.wait, timeout, cancel)
        finally:
            watch.close()

    def store_time(self, election: str) -> float | None:
        with self.etcd.deadline():
            self._look(election)
        return server_time()

    def holders(self, elections: Sequence[str] | None = None) -> dict[str, HolderInfo | None]:
        found: dict[str, HolderInfo | None] = {}
        for election in self._elections() if elections is None else elections:
            with self.etcd.deadline():
                held, offset = self._look(election)
                found[election] = None if held is None else self._holder(election, held, offset)
        return found

    def request_resign(self, election: str) -> HolderInfo | None:
        with self.etcd.deadline():
            held, offset = self._look(election)
            if held is None:
                return None
            info = self._holder(election, held, offset)
            term_key, resign_key = (self.etcd.key(election, k) for k in ("term", "resign"))
            # On the holder's lease, so the request ends with the term it names.
            lease, nonce = int(held["lease"]), _nonce_of(held).encode()
            self.etcd.txn(
                [wire.created_at(term_key, int(held["create_revision"]))],
                [wire.put(resign_key, nonce, lease)],
            )
        return info

    def _elections(self) -> list[str]:
        """Names of the elections under this key prefix with any key."""
        # One key per election, skipping to the next election's keys: reading
        # every key (a run ledger holds two a record) took seconds at 200,000.
        names: list[str] = []
        start = f"{self.etcd.key_prefix}/".encode()
        end = wire.prefix_end(start)
        while True:
            kvs = self.etcd.kv_range(start, end, limit=1, keys_only=True).get("kvs", [])
            if not kvs:
                return names
            key = wire.unb64(kvs[0]["key"])
            parts = key.split(b"/")
            if len(parts) < 3:
                start = key + b"\0"
                continue
            names.append(parts[1].decode())
            start = wire.prefix_end(self.etcd.key(names[-1], ""))

    def _look(self, election: str) -> tuple[dict[str, Any] | None, int]:
        """The term key of ``election`` (``None``: free) and its epoch offset."""
        term_key, offset_key = (self.etcd.key(election, k) for k in ("term", "epoch-offset"))
        reply = self.etcd.txn([], [wire.read(term_key), wire.read(offset_key)])
        term, offset_kv = (wire.kv(r) for r in reply["responses"])
        self._saw(election, int(reply["header"]["revision"]))
        return term, self._offset(offset_key, offset_kv)

    def _saw(self, election: str, revision: int) -> None:
        with self._lock:
            self._seen[election] = revision

    def _holder(self, election: str, term: dict[str, Any], offset: int) -> HolderInfo:
        """The holder of ``term``, with its lease's remaining whole seconds (one call)."""
        info = self._info(election, term, offset)
        lease = int(term["lease"])
        # etcd truncates to whole seconds: the true time left is below this + 1.
        left = self.etcd.call(lambda c: _lease_call(c, "/kv/lease/timetolive", lease))
        return replace(info, ttl_remaining=float(max(0, left)))

    def _info(self, election: str, term: dict[str, Any], offset: int) -> HolderInfo:
        where = f"etcd key {self.etcd.key(election, 'term').decode()!r}"
        text = wire.text(term)
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
        return 0 if kv is None else parse_epoch(wire.text(kv), f"etcd key {key.decode()!r}")

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

        self.etcd.call(revoke)


def _lease_call(client: Etcd3Client, path: str, lease: int) -> int:
    """The TTL left on ``lease`` after a keep-alive or time-to-live call; <= 0 when gone.

    The gateway reports errors of the streaming keep-alive with status 200: raised here."""
    reply = client.post(client.get_url(path), json={"ID": str(lease)})
    error = reply.get("error")
    if error is not None:
        # Unavailable (no Raft leader there): another member may do, as for a 503.
        unavailable = error.get("grpc_code") == UNAVAILABLE
        raise (ConnectionFailedError if unavailable else Etcd3Exception)(json.dumps(error))
    return int(reply.get("result", reply).get("TTL", -1))


def _nonce_of(term: dict[str, Any]) -> str:
    try:
        data = json.loads(wire.text(term))
    except ValueError:
        return ""
    return str(data.get("token", "")) if isinstance(data, dict) else ""
