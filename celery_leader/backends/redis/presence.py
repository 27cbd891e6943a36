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
backend checks this once (see ``RedisBackend``): a server that refuses the
commands, or counts elsewhere, makes it fall back to the ttl.
"""

from __future__ import annotations

import time
from typing import Any

import redis

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


class Subscription:
    """This backend's pub/sub connection for one election.

    It listens on the release channel (releases and take-overs are announced
    there) and, when ``presence`` is set, keeps that presence channel alive.
    """

    def __init__(self, pubsub: Any, presence: str | None) -> None:
        self._pubsub = pubsub
        #: The id a term won through this connection names; ``None``: no presence.
        self.presence = presence

    @classmethod
    def open(
        cls,
        client: Any,
        released: str,
        presence: tuple[str, str] | None,
        timeout: float,
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
