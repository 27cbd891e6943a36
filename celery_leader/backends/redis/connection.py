"""Connecting to Redis: client options, the URL forms, the lazily built client.

One :class:`Connection` per opened store, shared by its facets. Nothing connects
before the first call, so a Redis down at start-up is an outage, not a crash.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.connection import parse_url
from redis.exceptions import ClusterDownError, MovedError, RedisClusterException, TryAgainError
from redis.retry import Retry
from redis.sentinel import Sentinel

from ...exceptions import ConfigError, StoreMisconfigured, StoreUnavailable
from .. import StoreParams
from ..errors import summarise
from ..urls import mask_url
from .scripts import checked, register


def _options(url: str, timeout: float) -> dict[str, Any]:
    """Client options for ``url`` whose every call gives up after ``timeout``;
    redis-py's retries are off (a silently retried renewal eats into the lease)."""
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": True,
    }
    if urlsplit(url).scheme.lower() != "unix":  # unix socket connections take no TCP options
        options["socket_keepalive"] = True
    return options


def _cluster_url(url: str) -> str | None:
    """``url`` without ``cluster=true`` when it asks for Redis Cluster, else None."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    if query.pop("cluster", "").lower() not in ("1", "true", "yes"):
        return None
    return urlunsplit(parts._replace(query=urlencode(query)))


def _client(url: str, options: dict[str, Any]) -> Any:
    """A client for a standalone or Sentinel-managed Redis; neither connects yet."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "redis+sentinel":
        return redis.Redis.from_url(url, **options)
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ConfigError(
            "leader_url: a redis+sentinel:// URL needs the service name, like "
            "redis+sentinel://:password@host1:26379,host2:26379/mymaster/0"
        )
    hosts = []
    for hostport in parts.netloc.rpartition("@")[2].split(","):
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "26379")
        hosts.append((host, int(port or 26379)))
    password = unquote(parts.password) if parts.password else None
    sentinel_kwargs = {k: v for k, v in options.items() if k != "decode_responses"}
    query = dict(parse_qsl(parts.query))
    if "sentinel_password" in query:
        sentinel_kwargs["password"] = query["sentinel_password"]
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, **options)  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis-py 8.2
    db = int(path[1]) if len(path) > 1 else 0
    return sentinel.master_for(path[0], password=password, db=db, **options)  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis-py 8.2


class Connection:
    """The client of one store URL, its registered scripts, and calls that fail in one line."""

    def __init__(self, params: StoreParams) -> None:
        self.url = url = params.url
        self.timeout = params.timeout
        self.key_prefix = params.key_prefix
        self._options = _options(url, self.timeout)
        self._cluster_url = _cluster_url(url)
        self._redis: Any = None
        self._scripts: dict[str, Script] = {}
        self._lock = threading.Lock()
        #: How often a Cluster call was tried again on a refreshed slot map: a
        #: subscription opened before the last refresh may be on a dead node.
        self.reroutes = 0
        try:
            if self._cluster_url is None:
                self._redis = _client(url, self._options)
                self._scripts = register(self._redis)
            else:
                # Only checked here: a cluster client connects when it is built,
                # which waits for the first call (see client()).
                parse_url(self._cluster_url)  # type: ignore[no-untyped-call]
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"leader_url {mask_url(url)!r} is not a valid Redis URL: {exc}"
            ) from exc

    def client(self) -> Any:
        """The client; a Cluster client is built (and so connects) on first use."""
        client = self._redis
        if client is not None:
            return client
        assert self._cluster_url is not None
        with self._lock:
            if self._redis is None:
                cluster = self._connect_cluster(self._cluster_url)
                self._scripts = register(cluster)
                self._redis = cluster
            return self._redis

    def _connect_cluster(self, url: str) -> RedisCluster:
        # Ask the seed node first: a server without cluster support makes
        # redis-py fail with a long trace, and retrying cannot help.
        probe = redis.Redis.from_url(url, **self._options)
        try:
            enabled = probe.info("cluster").get("cluster_enabled")
        finally:
            probe.close()
        if not enabled:
            parts = urlsplit(url)
            raise StoreMisconfigured(
                f"leader_url {mask_url(self.url)!r} asks for Redis Cluster (?cluster=true), "
                f"but the server at {parts.hostname}:{parts.port or 6379} has cluster support "
                "disabled: drop ?cluster=true, or point leader_url at a cluster node"
            )
        return RedisCluster.from_url(url, **self._options)

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(client, ...)``, errors as StoreUnavailable; Cluster retries: :func:`_rerouted`."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return fn(self.client(), *args, **kwargs)
            except (redis.RedisError, RedisClusterException) as exc:
                if not _rerouted(self._redis, exc, deadline):
                    raise StoreUnavailable(summarise(exc)) from exc
                with self._lock:  # the client is built, so nobody holds this one for long
                    self.reroutes += 1

    def key(self, election: str, name: str) -> str:
        """Key ``name`` of ``election``, with the election's hash tag (one Cluster slot)."""
        return f"{{{self.key_prefix}:{election}}}:{name}"

    def keys(self, election: str, *names: str) -> list[str]:
        """:meth:`key` of each of ``names``, in order."""
        return [self.key(election, name) for name in names]

    def pipelined(self, queue: Callable[[Any], object], raise_on_error: bool = True) -> list[Any]:
        """The replies of the commands ``queue(pipeline)`` queues, in one round trip."""

        def run(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            queue(pipe)
            return list(pipe.execute(raise_on_error=raise_on_error))

        return list(self.call(run))

    def script(self, name: str) -> Script:
        """Script ``name``, registered on the client (built first if need be)."""
        self.client()
        return self._scripts[name]

    def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run script ``name``: one round trip once the server has cached it."""
        script = self.script(name)
        return checked(self.call(lambda client: script(keys, args, client=client)))

    def close(self) -> None:
        """Close the client's connections, if it was ever built."""
        if self._redis is not None:
            self._redis.close()


def has(expected: str | None) -> str:
    """A script argument saying whether a compare-and-set expects a stored value."""
    return "0" if expected is None else "1"


def seconds(time: list[Any]) -> float:
    """Redis ``TIME`` (``[seconds, microseconds]``) as seconds since the epoch."""
    return int(time[0]) + int(time[1]) / 1e6


#: Errors after which a Cluster client's slot map may be wrong: the node is gone
#: (killed, its replica promoted), or it says that another node serves the slot.
_REROUTE = (redis.ConnectionError, MovedError, ClusterDownError, TryAgainError)
#: Between two tries on a refreshed slot map: until the cluster has promoted a
#: replica, the map still names the dead master, and refusals come back at once.
#:
#: A Cluster master and the leader die together: the followers ask again
#: presence.WATCH_INTERVAL later, on refreshed maps until the store deadline, so a
#: promotion within it costs this pause, one CLUSTER SLOTS, the subscription and the
#: acquire (~0.06 s) + beat's look (0.1 s) and up to one schedule period; a later one
#: adds up to renew_interval. Measured (3 beats, ttl 3 s, an entry every 0.2 s):
#: first dispatch 0.1-0.4 s after the kill.
_REROUTE_PAUSE = 0.05


def _rerouted(client: Any, exc: BaseException, deadline: float) -> bool:
    """True when a call that failed with ``exc`` may be tried again: a Cluster client,
    ``exc`` says the slot map may be wrong, and the map was refreshed before ``deadline``.

    redis-py refreshes the map itself, but not for a connection taken out of a node's
    pool (:class:`.acks.Pinned`) nor for pub/sub. A retried write is fenced by the
    term or no longer matches, so it is never applied twice."""
    if not isinstance(client, RedisCluster) or not isinstance(exc, _REROUTE):
        return False
    if isinstance(exc, redis.AuthenticationError):
        return False  # the node is there and refuses us: a new map cannot help
    while time.monotonic() + _REROUTE_PAUSE < deadline:
        time.sleep(_REROUTE_PAUSE)
        try:
            client.nodes_manager.initialize()
            return True
        except (redis.RedisError, RedisClusterException):
            continue  # no node answered yet: try again while there is time
    return False
