"""Presence on Redis: a subscription that ends when its holder's connection does.

Redis cannot tell a dead holder from a slow one by its key, which lives out
its ttl either way. But a process that dies closes its TCP connections, and
Redis drops their subscriptions the moment it sees them close. So every
candidate keeps, per election, one pub/sub connection subscribed to the
release channel and to a presence channel of its own,
``{p:e}:present:<id>`` (``id`` random per connection), and the term it wins
names that id. A follower's acquire script counts the channel's subscribers
(``PUBSUB NUMSUB``): none means the holder's connection is gone, and the
script takes the term over with a new epoch, in the same atomic step that
checked the lock still names that term. The subscription is confirmed before
the acquire that names it is sent, so a term never names a presence that is
not there yet.

A paused (``SIGSTOP``) or partitioned holder keeps its connection open from
Redis's side, so it keeps its presence and the ttl bound applies as before.
A holder whose connection Redis closed while it lives (a reset, a proxy, an
operator's ``CLIENT KILL``) sees the same socket close: it stops believing at
once (:meth:`Subscription.idle` raises) and hands over.

In Redis Cluster, ``PUBSUB NUMSUB`` counts only the subscribers of the node
it runs on. redis-py opens a subscription on the node that serves the hash
slot of its first channel, so the presence channel goes first: it carries the
election's hash tag, and the election's scripts run on that same node. Each
opened store checks this once (:class:`Presences`): a server that refuses the
commands, or counts elsewhere, makes it fall back to the ttl.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import redis

from ...exceptions import StoreUnavailable
from ..urls import mask_url
from .connection import Connection

logger = logging.getLogger(__name__)

#: How often the one designated successor of an election (see the acquire
#: script) checks the holder's presence; the other followers wait for the
#: holder's ttl, or a release or take-over announcement, as before.
#:
#: Fail-over after a holder's process dies, on Redis:
#:   this interval (when the check happens to fall)      <= 0.15 s
#: + one acquire round trip                               ~ 0.001 s on a LAN
#: and then the user of the lease notices: beat looks at its lease every 0.1 s
#: (``FOLLOWER_INTERVAL``), so a beat publishes again within about 0.25 s of the
#: crash, plus up to one schedule period if the slot was not due yet: under
#: half a second with an entry every 0.1 s. (At 0.2 s the worst of 10 kills on
#: a busy 2-core machine came to 0.48 s.)
#:
#: Cost: one round trip per interval per election, 6.7 a second whatever the
#: ttl. With 10 instances per election that is 0.67 round trips per instance
#: per second on top of the renewals and the other followers' waits (0.28 at
#: ttl 3 s): 200 holders in 20 elections stay under 1 (``benchmarks/store_load.py``).
WATCH_INTERVAL = 0.15


#: Store URLs this process has said it falls back to the ttl for. Global
#: because once per process is enough: a worker and its embedded beat, or many
#: leases, each open a store of their own.
_FALLBACKS: set[str] = set()
_FALLBACKS_LOCK = threading.Lock()


class Subscription:
    """One store's pub/sub connection for one election.

    It listens on the release channel (releases and take-overs are announced
    there) and, when ``presence`` is set, keeps that presence channel alive.
    """

    def __init__(self, pubsub: Any, presence: str | None) -> None:
        self._pubsub = pubsub
        #: The id a term won through this connection names; ``None``: no presence.
        self.presence = presence
        #: The store connection's reroute count when this was opened: one opened
        #: before the last slot-map refresh may be on a dead node.
        self.reroutes = 0

    @classmethod
    def open(
        cls, client: Any, released: str, presence: tuple[str, str] | None, timeout: float
    ) -> Subscription:
        """Subscribe ``client`` to ``released`` and ``presence`` (``(channel, id)``).

        Returns once Redis confirmed both, so that a term sent afterwards on
        another connection never names a presence Redis has not seen yet.
        """
        # The presence channel first: it decides the node of a Cluster subscription.
        channels = [released] if presence is None else [presence[0], released]
        pubsub = client.pubsub()
        try:
            pubsub.subscribe(*channels)
            _confirm(pubsub, released, timeout)
        except BaseException:
            pubsub.close()
            raise
        return cls(pubsub, None if presence is None else presence[1])

    def message(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for an announcement; True when one came.

        Reading the socket sends nothing to Redis. Raises a redis-py error when
        the connection is gone, which ends this subscription and its presence.
        """
        message = self._pubsub.get_message(timeout=timeout)
        return message is not None and message["type"] == "message"

    def idle(self, timeout: float) -> bool:
        """Keep the presence for up to ``timeout``; always False (never "ready").

        An announcement while we hold the term is of no use (it is either our
        own or one we learn from at the next renewal); a closed connection
        raises, which is what the holder waits for.
        """
        self.message(timeout)
        return False

    def close(self) -> None:
        """Close the connection: the presence ends with it."""
        try:
            self._pubsub.close()
        except redis.RedisError:
            pass  # the connection is gone already; nothing to tidy


def _confirm(pubsub: Any, channel: str, timeout: float) -> None:
    """Read until Redis confirms the subscription to ``channel`` (the last one asked)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=left)
        if message is not None and message["type"] == "subscribe" and message["channel"] == channel:
            return
    raise redis.TimeoutError(f"Redis did not confirm the subscription to {channel!r}")


class Presences:
    """One opened store's subscriptions, one per election, and whether terms
    keep a presence on this server."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._subscriptions: dict[str, Subscription] = {}
        #: Whether terms keep a presence: None until the first subscription
        #: has checked that this server counts it where the scripts run.
        self.enabled: bool | None = None
        self._lock = threading.Lock()

    def current(self, election: str) -> Subscription | None:
        """The subscription for ``election``, if one is open."""
        with self._lock:
            return self._subscriptions.get(election)

    def rerouted(self, election: str) -> bool:
        """True when a Cluster call went to a refreshed slot map after ``election``'s
        subscription was opened."""
        current = self.current(election)
        return current is not None and current.reroutes != self._conn.reroutes

    def open(self, election: str, ident: str | None = None) -> Subscription | None:
        """The subscription for ``election``, opened and confirmed first if need be.

        One opened before the last slot-map refresh is replaced first: a term
        must not name a presence that no node of the election counts. A new
        one keeps presence id ``ident`` (a new one when ``None``). ``None`` when
        the server refuses it (ACL channel rules): then followers poll at the
        holder's ttl, and terms keep no presence.
        """
        reroutes = self._conn.reroutes
        current = self.current(election)
        if current is not None and current.reroutes == reroutes:
            return current
        self.drop(election)
        released = self._conn.key(election, "released")
        presence = None
        if self.enabled is not False:
            ident = ident or uuid.uuid4().hex
            presence = (self._conn.key(election, f"present:{ident}"), ident)
        subscription: Subscription
        try:
            subscription = self._conn.call(
                Subscription.open, released, presence, self._conn.timeout
            )
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, redis.ResponseError):
                raise
            self._off(f"SUBSCRIBE was refused ({exc})")
            return None
        if presence is not None and self.enabled is None:
            self._check(election, presence[0], subscription)
        if not self.enabled:
            subscription.presence = None
        subscription.reroutes = reroutes
        with self._lock:
            self._subscriptions[election] = subscription
        return subscription

    def _check(self, election: str, channel: str, subscription: Subscription) -> None:
        """Presence on, if a script on the election's node counts ``channel``'s subscriber."""
        try:
            count = self._conn.run("subscribers", [self._conn.key(election, "lock")], [channel])
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, redis.ResponseError):
                subscription.close()
                raise
            self._off(f"PUBSUB NUMSUB in a script was refused ({exc})")
            return
        if int(count) < 1:
            self._off("PUBSUB NUMSUB does not count this client's subscription there")
            return
        self.enabled = True

    def _off(self, why: str) -> None:
        with self._lock:
            self.enabled = False
        url = self._conn.url
        with _FALLBACKS_LOCK:
            said = url in _FALLBACKS
            _FALLBACKS.add(url)
        if not said:
            logger.info(
                "celery-leader: Redis at %s: %s; a holder that dies is replaced when its "
                "ttl runs out, not at once",
                mask_url(url),
                why,
            )

    def drop(self, election: str) -> None:
        """Close ``election``'s subscription, and with it the presence it keeps."""
        with self._lock:
            subscription = self._subscriptions.pop(election, None)
        if subscription is not None:
            subscription.close()

    def close(self) -> None:
        """Close every subscription."""
        for election in list(self._subscriptions):
            self.drop(election)
