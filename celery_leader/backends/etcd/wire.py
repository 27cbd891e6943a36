"""The gRPC gateway's JSON: operations of a transaction, and what its replies hold.

Keys and values travel base64-encoded; values are text with ``surrogateescape``,
so bytes celery-leader did not write read back as they are.
"""

from __future__ import annotations

import base64
from typing import Any

#: One operation of a transaction (or a comparison), as the gateway's JSON has it.
Op = dict[str, Any]

#: Operations per transaction. etcd's ``--max-txn-ops`` (128 by default) bounds
#: the operations of a transaction and of the ones nested in it together.
MAX_TXN_OPS = 64


def b64(data: bytes) -> str:
    """``data`` as the gateway's JSON carries keys and values."""
    return base64.b64encode(data).decode("ascii")


def unb64(data: str) -> bytes:
    """A key or value of the gateway's JSON."""
    return base64.b64decode(data)


def encode(value: str) -> bytes:
    """A value to store, from its text."""
    return value.encode("utf-8", "surrogateescape")


def text(found: dict[str, Any]) -> str:
    """The text of a key-value of a reply."""
    return unb64(found.get("value", "")).decode("utf-8", "surrogateescape")


def name(found: dict[str, Any], prefix: bytes) -> str:
    """The key of a key-value of a reply after ``prefix``, as text."""
    return unb64(found["key"])[len(prefix) :].decode()


def kv(response: dict[str, Any]) -> dict[str, Any] | None:
    """The key-value a transaction's range read found; ``None`` when none."""
    kvs = response.get("response_range", {}).get("kvs")
    return kvs[0] if kvs else None


def read(key: bytes) -> Op:
    """Read ``key``."""
    return {"request_range": {"key": b64(key)}}


def read_prefix(start: bytes, count_only: bool = False) -> Op:
    """Read every key starting with ``start`` (only how many, with ``count_only``)."""
    body = {"key": b64(start), "range_end": b64(prefix_end(start)), "count_only": count_only}
    return {"request_range": body}


def put(key: bytes, value: bytes, lease: int | None = None) -> Op:
    """Write ``key`` (on ``lease``, which deletes it when it ends)."""
    body: Op = {"key": b64(key), "value": b64(value)}
    if lease is not None:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete(key: bytes) -> Op:
    """Delete ``key``."""
    return {"request_delete_range": {"key": b64(key)}}


def delete_range(start: bytes, end: bytes) -> Op:
    """Delete every key of ``[start, end)``."""
    return {"request_delete_range": {"key": b64(start), "range_end": b64(end)}}


def created_at(key: bytes, revision: int) -> Op:
    """Compare: ``key`` was created at ``revision`` (0: it does not exist)."""
    at = str(revision)
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": at}


def modified_at(key: bytes, found: dict[str, Any] | None) -> Op:
    """Compare: ``key`` is as it was read (``found``; ``None`` when it did not exist)."""
    mod = int(found["mod_revision"]) if found else 0
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod)}


def holds(key: bytes, expected: str | None) -> Op:
    """Compare: ``key`` holds exactly ``expected`` (``None``: it does not exist)."""
    if expected is None:
        return created_at(key, 0)
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(encode(expected))}


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with ``prefix`` (which ends in "/")."""
    return prefix[:-1] + bytes([prefix[-1] + 1])
