"""Redis writes that a fail-over cannot roll back: ``WAIT`` on the connection that wrote.

``WAIT`` counts only the writes of the connection it is sent on, and redis-py hands
a pipeline's connection back after each round trip, hence :class:`Pinned`.
:class:`Replicas` decides how many replicas must acknowledge (``auto``: every one
online, and behind Sentinel every one it could promote).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import NoPermissionError, NoScriptError, RedisError, ResponseError

from ...exceptions import StoreMisconfigured, StoreUnavailable

#: Sentinel promotes no replica whose link to the master has been down for
#: longer than this many ``down-after-milliseconds`` (``sentinelSelectSlave``).
PROMOTABLE_LINK_DOWN = 10


@dataclass(frozen=True)
class Acks:
    """How many replicas had to acknowledge a write (``None``: unknown), and how many did."""

    needed: int | None
    acked: int

    @property
    def enough(self) -> bool:
        """True when the write is on every replica that had to acknowledge it."""
        return self.needed is not None and self.acked >= self.needed


class Pinned:
    """One pooled connection held for several round trips (in Cluster, to the node
    that serves ``key``, which the writes and their ``WAIT`` must reach)."""

    def __init__(self, client: Any, key: str) -> None:
        #: The Cluster node (``host:port``) the connection goes to; ``None`` outside Cluster.
        self.node: str | None = None
        if isinstance(client, RedisCluster):
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            self.node = node.name
            client = client.get_redis_connection(node)
        self._pool = client.connection_pool
        self._conn: Any = None
        self._clean = True

    def __enter__(self) -> Pinned:
        try:
            self._conn = self._pool.get_connection()
        except TypeError:  # redis-py before 5.3 requires a command name, which it ignores
            self._conn = self._pool.get_connection("WAIT")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._clean or kind is not None:
            # Replies may be left unread on the socket: it cannot be reused.
            self._conn.disconnect()
        self._pool.release(self._conn)

    def send(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Every command in one round trip; an error reply comes back as its exception."""
        self._clean = False
        conn = self._conn
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
        self._clean = True
        return replies

    def scripts(
        self,
        sha: str,
        source: str,
        keys: Sequence[str],
        calls: Sequence[Sequence[Any]],
        replicas: int | None,
    ) -> tuple[list[Any], int | None]:
        """Run one script once per argument list in ``calls``, all in one round trip.

        Returns the replies and how many replicas must acknowledge them: ``replicas``,
        or with ``None`` ("auto") those ``ROLE`` reports online, asked in the same round
        trip. A call refused with ``NOSCRIPT`` runs once more, in full, which caches it."""
        commands: list[Sequence[Any]] = [("EVALSHA", sha, len(keys), *keys, *a) for a in calls]
        if replicas is None:
            commands.append(("ROLE",))
        replies = self.send(commands)
        if replicas is None:
            replicas = _online(replies.pop())
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                (replies[i],) = self.send([("EVAL", source, len(keys), *keys, *calls[i])])
            if isinstance(replies[i], Exception):
                raise replies[i]
        return replies, replicas

    def online(self) -> int | None:
        """Replicas the master lists online (``ROLE``); ``None`` when that is refused."""
        (reply,) = self.send([("ROLE",)])
        return _online(reply)

    def wait(self, needed: int | None, timeout: float) -> Acks:
        """``WAIT`` until ``needed`` replicas hold this connection's writes, at most ``timeout``."""
        if needed is None:
            return Acks(None, 0)
        if needed == 0:
            return Acks(0, 0)
        (reply,) = self.send([("WAIT", needed, max(1, math.ceil(timeout * 1000)))])
        if isinstance(reply, Exception):
            raise reply
        return Acks(needed, int(reply))


def _online(role: Any) -> int | None:
    """Replicas a ``ROLE`` reply lists (online ones only); ``None`` when it was refused."""
    if isinstance(role, NoPermissionError):
        return None
    if isinstance(role, Exception):
        raise role
    # ["master", offset, [[host, port, offset], ...]]; a replica has none of its own.
    return len(role[2]) if role[0] == "master" else 0


def listed_replicas(nodes: str) -> int:
    """Replicas that a ``CLUSTER NODES`` reply lists for the node that sent it, not
    flagged failed: the cluster still counts them, and an operator may promote them."""
    rows = [line.split() for line in nodes.splitlines() if line.strip()]
    me = next(row[0] for row in rows if "myself" in row[2].split(","))
    return sum(1 for row in rows if row[3] == me and "fail" not in row[2].split(","))


def promotable_replicas(client: Any) -> int | None:
    """Replicas of a Sentinel-managed master that Sentinel could promote now, by its
    own rules (not down, priority not 0, link down no longer than
    :data:`PROMOTABLE_LINK_DOWN` x ``down-after-milliseconds``); ``None``: unknown."""
    pool: Any = getattr(client, "connection_pool", None)  # a Cluster client has none
    manager = getattr(pool, "sentinel_manager", None)
    if manager is None:
        return None
    for sentinel in manager.sentinels:
        try:
            master = sentinel.sentinel_master(pool.service_name)
            replicas = sentinel.sentinel_slaves(pool.service_name)
        except RedisError:
            continue
        limit = master["down-after-milliseconds"] * PROMOTABLE_LINK_DOWN
        return sum(
            1
            for r in replicas
            if not (r["is_sdown"] or r["is_odown"] or r["is_disconnected"])
            and r.get("slave-priority", 1) != 0
            and r.get("master-link-down-time", 0) <= limit
        )
    return None


class Replicas:
    """How many replicas must acknowledge the acquires and claims of one opened store.

    ``acks`` is ``leader_replica_acks`` (``None``: "auto").
    """

    def __init__(self, acks: int | None, store_timeout: float) -> None:
        self.acks = acks
        self._store_timeout = store_timeout
        #: How long a write waits for replicas: half the store deadline, so that
        #: handing back what they did not acknowledge still fits in the other half.
        self.timeout = store_timeout / 2
        self._lock = threading.Lock()
        #: (when, count) of :meth:`_promotable`, asked of the sentinels.
        self._promotable_cache: tuple[float, int | None] | None = None
        #: Per election, in Cluster with "auto": (term, node, replicas) of :meth:`needed`.
        self._term_replicas: dict[str, tuple[str, str, int]] = {}

    def needed(
        self, client: Any, conn: Pinned, election: str, token: str, online: int | None
    ) -> int | None:
        """Replicas that must acknowledge a write of term ``token`` of ``election`` on
        ``conn``, ``online`` being how many the master lists online now.

        In Cluster, a replica whose link drops is no longer online yet can still be
        promoted: so the replicas a term saw on its node stay needed for the rest of the
        term while ``CLUSTER NODES`` lists them, not failed. Kept per term and node."""
        if self.acks is not None:
            return self.acks
        known = [n for n in (online, self._promotable(client)) if n is not None]
        if not known or conn.node is None:
            return max(known, default=None)
        needed = max(known)
        with self._lock:
            seen = self._term_replicas.get(election)
        if seen is not None and seen[:2] == (token, conn.node) and seen[2] > needed:
            # Only when replicas went missing: one more round trip, to the same node.
            (nodes,) = conn.send([("CLUSTER", "NODES")])
            if isinstance(nodes, NoPermissionError):
                listed = seen[2]  # nobody to ask: the replicas stay needed for the term
            elif isinstance(nodes, Exception):
                raise nodes
            else:
                listed = listed_replicas(nodes)
            needed = max(needed, min(seen[2], listed))
        with self._lock:
            self._term_replicas[election] = (token, conn.node, needed)
        return needed

    def _promotable(self, client: Any) -> int | None:
        """Behind Sentinel, the replicas Sentinel could promote, asked at most once per
        store deadline (one that drops out meanwhile is still waited for: claims fail)."""
        now = time.monotonic()
        with self._lock:
            cached = self._promotable_cache
        if cached is not None and now - cached[0] < self._store_timeout:
            return cached[1]
        count = promotable_replicas(client)
        if count is None and cached is not None:
            count = cached[1]  # no sentinel answered: they cannot promote anyone either
        with self._lock:
            self._promotable_cache = (now, count)
        return count

    def refused(self, acks: Acks, what: str, done: str) -> StoreUnavailable:
        """The error for ``what`` too few replicas acknowledged (``done``: what became of it)."""
        if acks.needed is None:
            return StoreMisconfigured(
                f"leader_replica_acks is 'auto', which asks the Redis master how many replicas "
                f"it has (ROLE), and this user may not run ROLE ({done}): grant it +role, or "
                "set leader_replica_acks to how many replicas must acknowledge each claim"
            )
        return StoreUnavailable(
            f"{what} not on {acks.needed} replica(s) of the Redis master within "
            f"{self.timeout:g} s ({acks.acked} acknowledged), so a fail-over could "
            f"undo it: {done}"
        )
