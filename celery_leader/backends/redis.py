"""Redis store: ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``, Cluster.

Add ``?cluster=true`` to a ``redis://`` or ``rediss://`` URL for Redis Cluster.

Keys of one election share the hash tag ``{<prefix>:<election>}`` so that every
script touches a single Redis Cluster slot:

* ``{p:e}:lock``   - the term: JSON ``{"token", "epoch", "holder"}``, with a PX ttl
* ``{p:e}:epoch``  - counter of terms; never expires
* ``{p:e}:resign`` - the term an operator asked to hand over (``leader resign``)
* ``{p:e}:state``  - hash of shared schedule state, entry -> JSON

Releases are announced on the channel ``{p:e}:released`` so that followers
take over at once instead of waiting out the ttl.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from .._urls import mask_url
from ..exceptions import ConfigError, StoreUnavailable
from .base import Acquired, Backend, Claim, HolderInfo, Renewal, Tenure

# KEYS: lock, epoch. ARGV: nonce, instance id, ttl ms, lowest acceptable epoch - 1.
# Returns {1, value, ttl ms} when taken, {0, holder value, pttl} when held.
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur, redis.call('PTTL', KEYS[1])} end
if redis.call('EXISTS', KEYS[2]) == 0 then
  -- First term, or the store lost its data: start from the server's clock in ms
  -- so that epochs still grow past any term handed out before.
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], t[1] * 1000 + math.floor(t[2] / 1000))
end
local epoch = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[4])
if epoch <= floor then
  epoch = floor + 1
  redis.call('SET', KEYS[2], epoch)
end
local value = cjson.encode({token = ARGV[1], epoch = epoch, holder = ARGV[2]})
redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
return {1, value, tonumber(ARGV[3])}
"""

# KEYS: lock, resign. ARGV: our exact value, ttl ms. 0 lost, 1 renewed, 2 resign.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  return 2
end
return 1
"""

# KEYS: lock. ARGV: our exact value, release channel.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
"""

# KEYS: lock, state. ARGV: our exact value, then per claim: entry, has-expected
# ("0"/"1"), expected, new. Returns one 0/1 per claim; {} when the term is gone.
_CLAIM = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {} end
local kind = redis.call('TYPE', KEYS[2]).ok
if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', KEYS[2]) end
local out = {}
for i = 2, #ARGV, 4 do
  local cur = redis.call('HGET', KEYS[2], ARGV[i])
  local ok
  if ARGV[i + 1] == '0' then ok = (cur == false) else ok = (cur == ARGV[i + 2]) end
  if ok then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 3])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""

logger = logging.getLogger("celery_leader.backends.redis")

#: Claims per script call: bounds how long one call blocks Redis; all chunks
#: still go out in one pipelined round trip.
_CLAIM_CHUNK = 500


def _client(url: str, timeout: float) -> Any:
    """A redis-py client for ``url`` whose every call gives up after ``timeout``.

    redis-py's own retries are off: the lease decides when to retry, and a
    silently retried renewal would only eat into the lease's validity.
    """
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": True,
    }
    parts = urlsplit(url)
    if parts.scheme.lower() != "unix":  # unix socket connections take no TCP options
        options["socket_keepalive"] = True
    query = dict(parse_qsl(parts.query))
    if query.pop("cluster", "").lower() in ("1", "true", "yes"):
        plain = urlunsplit(parts._replace(query=urlencode(query)))
        return RedisCluster.from_url(plain, **options)
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
    if "sentinel_password" in query:
        sentinel_kwargs["password"] = query["sentinel_password"]
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, **options)  # type: ignore[no-untyped-call]
    db = int(path[1]) if len(path) > 1 else 0
    return sentinel.master_for(path[0], password=password, db=db, **options)  # type: ignore[no-untyped-call]


class RedisBackend(Backend):
    """Lease store on one Redis (standalone, Sentinel-managed, or behind TLS)."""

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        super().__init__(url, key_prefix, timeout)
        try:
            self._redis = _client(url, timeout)
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"leader_url {mask_url(url)!r} is not a valid Redis URL: {exc}"
            ) from exc
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._renew = self._redis.register_script(_RENEW)
        self._release = self._redis.register_script(_RELEASE)
        self._claim = self._redis.register_script(_CLAIM)
        self._pubsubs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _key(self, election: str, name: str) -> str:
        return f"{{{self.key_prefix}:{election}}}:{name}"

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except redis.RedisError as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        ttl_ms = max(1, int(ttl * 1000))
        taken, value, pttl = self._call(
            self._acquire,
            keys=[self._key(election, "lock"), self._key(election, "epoch")],
            args=[uuid.uuid4().hex, instance_id, ttl_ms, min_epoch],
        )
        if taken:
            return Acquired(Tenure(value, _parse(value)["epoch"]), None, ttl)
        info = _holder_info(value, pttl)
        return Acquired(None, info, ttl if pttl < 0 else pttl / 1000)

    def renew(self, election: str, tenure: Tenure, ttl: float) -> Renewal:
        code = self._call(
            self._renew,
            keys=[self._key(election, "lock"), self._key(election, "resign")],
            args=[tenure.token, max(1, int(ttl * 1000))],
        )
        return {0: Renewal.LOST, 1: Renewal.RENEWED, 2: Renewal.RESIGN}[int(code)]

    def release(self, election: str, tenure: Tenure) -> None:
        self._call(
            self._release,
            keys=[self._key(election, "lock")],
            args=[tenure.token, self._key(election, "released")],
        )

    def wait(self, election: str, timeout: float, cancel: threading.Event) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            pubsub = self._pubsubs.get(election)
        try:
            if pubsub is None:
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self._key(election, "released"))
                with self._lock:
                    self._pubsubs[election] = pubsub
                # A release may have happened before the subscription took
                # effect: return so the caller tries once more, now covered.
                return
            # Slices keep ``cancel`` responsive; reading the subscription
            # socket sends nothing to Redis.
            while not cancel.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                if pubsub.get_message(timeout=min(left, 0.1)) is not None:
                    return
        except redis.RedisError:
            self._drop_pubsub(election)
            cancel.wait(max(0.0, deadline - time.monotonic()))

    def _drop_pubsub(self, election: str) -> None:
        with self._lock:
            pubsub = self._pubsubs.pop(election, None)
        if pubsub is not None:
            try:
                pubsub.close()
            except redis.RedisError:
                pass  # the connection is gone already; nothing to tidy

    def _term(self, election: str) -> tuple[str | None, int]:
        """The stored term of ``election`` and its PTTL, in one round trip."""
        key = self._key(election, "lock")
        pipe = self._redis.pipeline()
        pipe.get(key)
        pipe.pttl(key)
        value, pttl = self._call(pipe.execute)
        return value, pttl

    def holder(self, election: str) -> HolderInfo | None:
        value, pttl = self._term(election)
        return None if value is None else _holder_info(value, pttl)

    def request_resign(self, election: str) -> HolderInfo | None:
        value, pttl = self._term(election)
        if value is None:
            return None
        # Expires with the term it names, so a stale request never lingers.
        self._call(self._redis.set, self._key(election, "resign"), value, px=max(1, pttl))
        return _holder_info(value, pttl)

    def elections(self) -> list[str]:
        names = set()
        for suffix in ("epoch", "state"):
            pattern = f"{{{self.key_prefix}:*}}:{suffix}"
            for key in self._call(lambda p=pattern: list(self._redis.scan_iter(match=p))):
                names.add(key[len(self.key_prefix) + 2 : -len(suffix) - 2])
        return sorted(names)

    def load_state(self, election: str) -> dict[str, str]:
        key = self._key(election, "state")
        try:
            return dict(self._call(self._redis.hgetall, key))
        except StoreUnavailable as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            # Not ours (or mangled): the next fenced claim replaces it.
            logger.error("celery-leader: %s is not schedule state (%s); replacing it", key, exc)
            return {}

    def claim(self, election: str, tenure: Tenure, claims: Sequence[Claim]) -> list[bool]:
        keys = [self._key(election, "lock"), self._key(election, "state")]
        chunks = [claims[i : i + _CLAIM_CHUNK] for i in range(0, len(claims), _CLAIM_CHUNK)]
        calls = []
        for chunk in chunks:
            args: list[str] = [tenure.token]
            for c in chunk:
                args += [c.entry, "0" if c.expected is None else "1", c.expected or "", c.new]
            calls.append(args)
        if isinstance(self._redis, RedisCluster):
            # Cluster pipelines refuse scripts; all chunks hit one slot anyway.
            replies = [self._call(self._claim, keys=keys, args=args) for args in calls]
        else:
            pipe = self._redis.pipeline(transaction=False)
            for args in calls:
                self._claim(keys=keys, args=args, client=pipe)
            replies = self._call(pipe.execute)
        results: list[bool] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            # An empty reply: our term was gone, so nothing in the chunk was claimed.
            results += [bool(r) for r in reply] if reply else [False] * len(chunk)
        return results

    def leave(self, election: str) -> None:
        self._drop_pubsub(election)

    def close(self) -> None:
        for election in list(self._pubsubs):
            self._drop_pubsub(election)
        self._redis.close()


def _parse(value: str) -> dict[str, Any]:
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("epoch"), int):
        raise StoreUnavailable(f"foreign data under the lease key: {value[:80]!r}")
    return data


def _holder_info(value: str, pttl: int) -> HolderInfo:
    data = _parse(value)
    return HolderInfo(
        str(data.get("holder", "?")), data["epoch"], None if pttl < 0 else pttl / 1000
    )
