"""Connecting to Redis: client options, the URL forms, the lazily built client.

``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``, and Redis
Cluster with ``?cluster=true``. Nothing connects before the first call, so a
Redis that is down at start-up (or a Cluster seed node) is an outage the lease
retries, not a crash.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.connection import parse_url
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..._urls import mask_url
from ...exceptions import ConfigError, StoreMisconfigured, StoreUnavailable
from ..errors import summarise
from .scripts import checked, register


def _options(url: str, timeout: float) -> dict[str, Any]:
    """Client options for ``url`` whose every call gives up after ``timeout``.

    redis-py's own retries are off: the lease decides when to retry, and a
    silently retried renewal would only eat into the lease's validity.
    """
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
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, **options)  # type: ignore[no-untyped-call]
    db = int(path[1]) if len(path) > 1 else 0
    return sentinel.master_for(path[0], password=password, db=db, **options)  # type: ignore[no-untyped-call]


class Connection:
    """The client of one store URL, its registered scripts, and calls that fail in one line."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self._options = _options(url, timeout)
        self._cluster_url = _cluster_url(url)
        self._redis: Any = None
        self._scripts: dict[str, Script] = {}
        self._lock = threading.Lock()
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
        """``fn(client, ...)``; every redis-py error becomes StoreUnavailable in one line."""
        try:
            return fn(self.client(), *args, **kwargs)
        except (redis.RedisError, RedisClusterException) as exc:
            raise StoreUnavailable(summarise(exc)) from exc

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
