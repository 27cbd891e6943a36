"""The Redis lease lock: terms in ``{p:e}:lock``, presence, replica-acknowledged epochs."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import RedisClusterException

from ..lock import Acquired, HolderInfo, LeaseLock, Renewal, Term
from ..terms import holder_info, parse_term, since_of
from ..waiting import wait_sliced
from .acks import Acks, Pinned, Replicas
from .connection import Connection, seconds
from .presence import WATCH_INTERVAL, Presences
from .scripts import SOURCES, checked


class RedisLock(LeaseLock):
    """Terms of elections on one Redis (standalone, Sentinel-managed, Cluster, or behind TLS)."""

    #: The scripts return ``TIME``: microseconds.
    clock_resolution = 1e-6

    def __init__(self, conn: Connection, presences: Presences, replicas: Replicas) -> None:
        self.url, self.timeout = conn.url, conn.timeout
        self._conn = conn
        self._presences = presences
        self._replicas = replicas

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        lock, epoch, watch, present, released = self._conn.keys(
            election, "lock", "epoch", "watch", "present:", "released"
        )
        subscription = self._presences.open(election)
        presence = subscription.presence if subscription is not None else None
        args = [uuid.uuid4().hex, instance_id, max(1, int(ttl * 1000)), min_epoch, presence or ""]
        args += [present, "1" if self._presences.enabled else "0", released]
        taken, value, pttl, watching, *now = self._acquire_durably(
            election, [lock, epoch, watch], args
        )
        if taken:
            if presence is not None and self._presences.rerouted(election):
                # The slot moved during this acquire: keep the term's presence
                # on the node that now holds it.
                self._presences.open(election, presence)
            stored = parse_term(value, f"Redis key {lock!r}")
            return Acquired(Term(value, stored["epoch"], since_of(stored)), None, ttl, seconds(now))
        retry = ttl if pttl < 0 else pttl / 1000
        if watching:
            retry = min(retry, WATCH_INTERVAL)
        return Acquired(None, _holder(value, pttl, lock), retry, seconds(now))

    def _acquire_durably(self, election: str, keys: list[str], args: list[Any]) -> list[Any]:
        """The acquire script's reply; a term it hands out is on the replicas before it
        counts (or a promoted replica would hand out its epoch again). One they did not
        acknowledge in time is released, and the call fails."""
        script, source = self._conn.script("acquire"), SOURCES["acquire"]
        replicas = self._replicas

        def run(client: Any) -> tuple[list[Any], Acks]:
            with Pinned(client, keys[0]) as conn:
                # Followers call this often; only a won term asks for the replicas.
                (reply,), _ = conn.scripts(script.sha, source, keys, [args], 0)
                if reply[0] != 1:
                    return reply, Acks(0, 0)
                online = conn.online() if replicas.acks is None else None
                needed = replicas.needed(client, conn, election, reply[1], online)
                return reply, conn.wait(needed, replicas.timeout)

        reply, acks = self._conn.call(run)
        reply = checked(reply)
        if not acks.enough:
            self.release(election, Term(reply[1], 0))
            raise replicas.refused(acks, "a new term", "released; nobody leads on it")
        return list(reply)

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, float | None]:
        keys = self._conn.keys(election, "lock", "resign")
        code, *now = self._conn.run("renew", keys, [term.token, max(1, int(ttl * 1000))])
        return {0: Renewal.LOST, 1: Renewal.RENEWED, 2: Renewal.RESIGN}[int(code)], seconds(now)

    def store_time(self, election: str) -> float | None:
        return seconds(self._conn.run("time", [self._conn.key(election, "lock")], []))

    def release(self, election: str, term: Term | None) -> None:
        if term is None:
            self._presences.drop(election)  # leaving: its presence and announcements go
        else:
            lock, released = self._conn.keys(election, "lock", "released")
            self._conn.run("release", [lock], [term.token, released])

    def wait(
        self, election: str, timeout: float, cancel: threading.Event, term: Term | None = None
    ) -> bool:
        deadline = time.monotonic() + timeout
        subscription = self._presences.current(election)
        if term is not None:
            presence = parse_term(term.token, "our own term").get("presence")
            if presence is None:
                subscription = None  # nothing to keep alive: just wait
            elif subscription is None or subscription.presence != presence:
                return False  # the connection the term names was dropped already
        if subscription is None:
            # No presence to keep, or a subscription dropped after an error (the
            # next acquire subscribes again).
            cancel.wait(timeout)
            return True
        ready = subscription.message if term is None else subscription.idle
        try:
            wait_sliced(ready, timeout, cancel)
        except (redis.RedisError, RedisClusterException):
            self._presences.drop(election)
            if term is not None:
                return False
            # Its node may be gone (a fail-over): ask again as soon as the designated
            # successor would, so this follower subscribes on the new node.
            cancel.wait(max(0.0, min(WATCH_INTERVAL, deadline - time.monotonic())))
        return True

    def _term(self, election: str) -> tuple[str | None, int, str]:
        """The stored term of ``election``, its PTTL and its key, in one round trip."""
        lock = self._conn.key(election, "lock")
        value, pttl = self._conn.run("term", [lock], [])
        return value, pttl, lock

    def holders(self, elections: Sequence[str] | None = None) -> dict[str, HolderInfo | None]:
        if elections is None:
            elections = self._elections()
        out: dict[str, HolderInfo | None] = {}
        for election in elections:
            value, pttl, lock = self._term(election)
            out[election] = None if value is None else _holder(value, pttl, lock)
        return out

    def _elections(self) -> list[str]:
        """Names of the elections under this key prefix that the store knows."""
        prefix = self._conn.key_prefix
        names = set()
        for suffix in ("epoch", "state"):
            pattern = f"{{{prefix}:*}}:{suffix}"
            for key in self._conn.call(lambda c, p=pattern: list(c.scan_iter(match=p))):
                names.add(key[len(prefix) + 2 : -len(suffix) - 2])
        return sorted(names)

    def request_resign(self, election: str) -> HolderInfo | None:
        value, pttl, lock = self._term(election)
        if value is None:
            return None
        info = _holder(value, pttl, lock)
        # Expires with the term it names, so a stale request never lingers.
        resign = self._conn.key(election, "resign")
        self._conn.call(lambda c: c.set(resign, value, px=max(1, pttl)))
        return info


def _holder(value: str, pttl: int, key: str) -> HolderInfo:
    return holder_info(value, f"Redis key {key!r}", None if pttl < 0 else pttl / 1000)
