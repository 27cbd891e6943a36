"""The Redis fenced records: the hash ``{p:e}:state``, claimed under the term in ``{p:e}:lock``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import hand_back
from ..records import Fence, FencedRecords, Write
from ..terms import unreadable_state
from .acks import Acks, Pinned, Replicas
from .connection import Connection, has
from .scripts import SOURCES, checked

#: Claims per script call: bounds how long one call blocks Redis; all chunks
#: still go out in one pipelined round trip.
_CLAIM_CHUNK = 500


class RedisRecords(FencedRecords):
    """Fenced records of elections on one Redis."""

    def __init__(self, conn: Connection, replicas: Replicas) -> None:
        self._conn = conn
        self._replicas = replicas

    def load(self, election: str) -> dict[str, str]:
        key = self._conn.key(election, "state")
        reply = self._conn.run("load_state", [key], [])
        if reply[0] == 0:
            return unreadable_state(f"Redis key {key!r}", f"a {reply[1]}")
        flat = reply[1:]
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def load_some(self, election: str, keys: Sequence[str]) -> dict[str, str] | None:
        if not keys:
            return {}  # HMGET needs a field: with none, Redis answers an error
        key = self._conn.key(election, "state")
        kind, values = self._conn.pipelined(
            lambda pipe: (pipe.type(key), pipe.hmget(key, list(keys))), raise_on_error=False
        )
        if kind not in ("hash", "none"):
            return None  # not a hash: load reports it (and reads it as empty)
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def compare_and_set(self, fence: Fence, writes: Sequence[Write]) -> list[bool]:
        election, token = fence.election, fence.term.token
        keys = self._conn.keys(election, "lock", "state")
        chunks = _chunks(writes)
        calls = [
            [token] + [a for w in chunk for a in (w.key, has(w.expected), w.expected or "", w.new)]
            for chunk in chunks
        ]
        script, source = self._conn.script("claim"), SOURCES["claim"]
        replicas = self._replicas

        def run(client: Any) -> tuple[list[Any], Acks]:
            with Pinned(client, keys[0]) as conn:
                replies, online = conn.scripts(script.sha, source, keys, calls, replicas.acks)
                needed = replicas.needed(client, conn, election, token, online)
                wrote = any(1 in reply for reply in replies)
                return replies, conn.wait(needed, replicas.timeout) if wrote else Acks(0, 0)

        replies, acks = self._conn.call(run)
        results: list[bool] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            # An empty reply: our term was gone, so nothing in the chunk was claimed.
            reply = checked(reply)
            results += [bool(r) for r in reply] if reply else [False] * len(chunk)
        if not acks.enough:
            done = hand_back(writes, results, lambda won: self._unclaim(keys, token, won))
            raise replicas.refused(acks, f"{sum(results)} claim(s)", done)
        return results

    def _unclaim(self, keys: list[str], token: str, writes: list[Write]) -> None:
        """Put back what ``writes`` replaced, where still stored (on the master)."""
        calls = [
            [token] + [a for w in chunk for a in (w.key, w.new, has(w.expected), w.expected or "")]
            for chunk in _chunks(writes)
        ]
        script, source = self._conn.script("unclaim"), SOURCES["unclaim"]

        def run(client: Any) -> None:
            with Pinned(client, keys[0]) as conn:
                conn.scripts(script.sha, source, keys, calls, 0)

        self._conn.call(run)


def _chunks(writes: Sequence[Write]) -> list[Sequence[Write]]:
    return [writes[i : i + _CLAIM_CHUNK] for i in range(0, len(writes), _CLAIM_CHUNK)]
