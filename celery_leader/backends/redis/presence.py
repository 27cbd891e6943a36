"""Presence on Redis: a subscription that ends when its holder's connection does.

Every candidate keeps, per election, one pub/sub connection subscribed to the
release channel and to ``{p:e}:present:<id>``, and the term it wins names that
id. A follower's acquire script takes the term over when ``PUBSUB NUMSUB`` counts
no subscriber: the holder's connection is gone. A paused or partitioned holder
keeps its connection, so the ttl bound applies as before.

In Redis Cluster, ``PUBSUB NUMSUB`` counts only the node it runs on, and redis-py
subscribes on the node of the first channel: so the presence channel (with the
election's hash tag) goes first. :class:`Presences` checks this once per store
and falls back to the ttl when it does not hold.
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

#: How often the one designated successor of an election checks the holder's
#: presence (the other followers wait for the ttl or an announcement).
#:
#: Fail-over after a holder dies: this interval (<= 0.15 s) + one acquire round trip
#: (~1 ms), then beat's look at its lease (every 0.1 s), so a beat publishes again
#: within about 0.25 s, plus up to one schedule period. (At 0.2 s the worst of 10
#: kills on a busy 2-core machine came to 0.48 s.) Cost: 6.7 round trips a second
#: per election whatever the ttl: 200 holders in 20 elections stay under 1 per
#: instance per second (``benchmarks/store_load.py``).
WATCH_INTERVAL = 0.15


#: Store URLs this process has said it falls back to the ttl for (once a process).
_FALLBACKS: set[str] = set()
_FALLBACKS_LOCK = threading.Lock()


class Subscription:
    """One store's pub/sub connection for one election (release and presence channels)."""

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
        """Subscribe ``client`` to ``released`` and ``presence`` (``(channel, id)``);
        returns once Redis confirmed both, so no term names a presence not there yet."""
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
        """Wait up to ``timeout`` for an announcement; raises when the connection is gone."""
        message = self._pubsub.get_message(timeout=timeout)
        return message is not None and message["type"] == "message"

    def idle(self, timeout: float) -> bool:
        """Keep the presence for up to ``timeout``; raises when the connection closes."""
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
    """One opened store's subscriptions, and whether terms keep a presence there."""

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
        """Whether the slot map was refreshed since ``election``'s subscription opened."""
        current = self.current(election)
        return current is not None and current.reroutes != self._conn.reroutes

    def open(self, election: str, ident: str | None = None) -> Subscription | None:
        """The subscription for ``election``, opened and confirmed first if need be
        (again after a slot-map refresh), with presence id ``ident`` (new when ``None``).
        ``None`` when the server refuses it: followers then poll at the holder's ttl."""
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
