"""Redis store: ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``, Cluster.

Add ``?cluster=true`` to a ``redis://`` or ``rediss://`` URL for Redis Cluster.

Keys of one election share the hash tag ``{<prefix>:<election>}`` so that every
script touches a single Redis Cluster slot:

* ``{p:e}:lock``   - the term: JSON ``{"token", "epoch", "holder", "presence"}``,
  with a PX ttl
* ``{p:e}:epoch``  - counter of terms; never expires
* ``{p:e}:resign`` - the term an operator asked to hand over (``leader resign``)
* ``{p:e}:watch``  - presence id of the follower that watches the holder closely
* ``{p:e}:state``  - hash of shared schedule state, entry -> JSON

Releases and take-overs are announced on the channel ``{p:e}:released`` so
that followers act at once instead of waiting out the ttl. A holder whose
connection closed (its process died) is taken over without waiting for the
ttl: see :mod:`celery_leader.backends.presence`.

Every operation is one Lua script, sent with ``EVALSHA``; only when the server
answers ``NOSCRIPT`` (its script cache is empty after a start or a flush) is
the script sent once more in full with ``EVAL``, which caches it. Scripts
check the types of the keys they read and report a key of the wrong type by
name (``{"foreign", key, what}``) instead of failing with Redis's ``WRONGTYPE``.
Claims and new terms are on the master's replicas before they count (see
:mod:`.redis_acks`): a fail-over cannot undo a claimed slot nor hand out an
epoch twice. Nothing connects before the first call, so a Redis that is down
at start-up (or a Cluster seed node) is an outage the lease retries, not a crash.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.exceptions import (
    ClusterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    RedisClusterException,
    TryAgainError,
)
from redis.retry import Retry
from redis.sentinel import Sentinel

from .._urls import mask_url
from ..exceptions import ConfigError, StoreMisconfigured, StoreUnavailable
from .base import Acquired, Backend, Claim, HolderInfo, Renewal, Term
from .presence import WATCH_INTERVAL, Subscription
from .redis_acks import Acks, Pinned, listed_replicas, promotable_replicas
from .terms import foreign, holder_info, parse_term, unreadable_state
from .waiting import wait_sliced

# Every script reports a key of the wrong type as {'foreign', key, what it holds}.
# redis.pcall returns an error as a table instead of aborting the script.

# KEYS: lock, epoch, watch. ARGV: nonce, instance id, ttl ms, lowest acceptable
# epoch - 1, our presence id ("" for none), presence channel prefix, "1" when
# presence may be checked, release channel.
# Returns {1, value, ttl ms} when taken, {0, holder value, pttl, watching} when
# held; watching = 1 makes the caller the election's designated successor.
# A holder whose term names a presence nobody keeps any more (its connection
# closed) is taken over here, atomically with reading its term; the other
# followers hear of it on the release channel.
_ACQUIRE = """
local function present(id)
  return redis.call('PUBSUB', 'NUMSUB', ARGV[6] .. id)[2] > 0
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then return {'foreign', KEYS[1], redis.call('TYPE', KEYS[1]).ok} end
local check = ARGV[7] == '1'
local taken_over = false
if cur then
  local ok, term = pcall(cjson.decode, cur)
  local id = ok and type(term) == 'table' and term.presence
  if not check or type(id) ~= 'string' or present(id) then
    -- One follower watches closely (the caller, unless a present one does already).
    local watching = 0
    if check and ARGV[5] ~= '' then
      local w = redis.pcall('GET', KEYS[3])
      if type(w) ~= 'string' or w == ARGV[5] or not present(w) then
        redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[3])
        watching = 1
      end
    end
    return {0, cur, redis.call('PTTL', KEYS[1]), watching}
  end
  taken_over = true
end
local kind = redis.call('TYPE', KEYS[2]).ok
if kind == 'none' then
  -- First term, or the store lost its data: start from the server's clock in ms
  -- so that epochs still grow past any term handed out before.
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], t[1] * 1000 + math.floor(t[2] / 1000))
elseif kind ~= 'string' then
  return {'foreign', KEYS[2], kind}
end
local epoch = redis.pcall('INCR', KEYS[2])
if type(epoch) == 'table' then return {'foreign', KEYS[2], redis.call('GET', KEYS[2])} end
local floor = tonumber(ARGV[4])
if epoch <= floor then
  epoch = floor + 1
  redis.call('SET', KEYS[2], epoch)
end
local presence = nil
if ARGV[5] ~= '' then presence = ARGV[5] end
local value = cjson.encode({token = ARGV[1], epoch = epoch, holder = ARGV[2], presence = presence})
redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
if presence and redis.pcall('GET', KEYS[3]) == presence then redis.call('DEL', KEYS[3]) end
if taken_over then redis.call('PUBLISH', ARGV[8], 'taken over') end
return {1, value, tonumber(ARGV[3])}
"""

# KEYS: lock, resign. ARGV: our exact value, ttl ms. 0 lost, 1 renewed, 2 resign.
# A lock or resign key of another type cannot hold our value: lost, no resign.
_RENEW = """
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.pcall('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  return 2
end
return 1
"""

# KEYS: lock. ARGV: our exact value, release channel.
_RELEASE = """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
"""

# KEYS: lock (only so that Cluster runs it on the election's node). ARGV: channel.
# How many subscribers the channel has on that node.
_SUBSCRIBERS = """
return redis.call('PUBSUB', 'NUMSUB', ARGV[1])[2]
"""

# KEYS: lock. Returns {value or nil, pttl}.
_TERM = """
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then return {'foreign', KEYS[1], redis.call('TYPE', KEYS[1]).ok} end
return {cur, redis.call('PTTL', KEYS[1])}
"""

# KEYS: state. Returns {1, field, value, ...}, or {0, type} when it is no hash.
_LOAD_STATE = """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then return {0, kind} end
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, 1)
return out
"""

# KEYS: lock, state. ARGV: our exact value, then per claim: entry, has-expected
# ("0"/"1"), expected, new. Returns one 0/1 per claim; {} when the term is gone.
# A state of another type is not ours to keep: the fenced claim replaces it.
_CLAIM = """
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return {} end
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

# KEYS: lock, state. ARGV: our exact value, then per claim: entry, the value the
# claim wrote, has-previous ("0"/"1"), previous. Puts back what a claim
# replaced, where the claim's value is still there; returns how many.
_UNCLAIM = """
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('TYPE', KEYS[2]).ok ~= 'hash' then return 0 end
local n = 0
for i = 2, #ARGV, 4 do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] then
    if ARGV[i + 2] == '1' then
      redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 3])
    else
      redis.call('HDEL', KEYS[2], ARGV[i])
    end
    n = n + 1
  end
end
return n
"""

logger = logging.getLogger("celery_leader.backends.redis")

#: Claims per script call: bounds how long one call blocks Redis; all chunks
#: still go out in one pipelined round trip.
_CLAIM_CHUNK = 500

#: Store URLs this process has said it falls back to the ttl for: once is enough
#: (a worker and its embedded beat, or many leases, each have a backend of their own).
_FALLBACKS: set[str] = set()
_FALLBACKS_LOCK = threading.Lock()

#: What each key is meant to hold, for errors about a key of the wrong type.
_EXPECTED = {
    "lock": "a celery-leader term (a JSON string)",
    "epoch": "an epoch counter (an integer string)",
}


@dataclass(frozen=True)
class _Script:
    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()  # noqa: S324 - Redis's script id


_SCRIPTS = {
    name: _Script(source)
    for name, source in (
        ("acquire", _ACQUIRE),
        ("renew", _RENEW),
        ("release", _RELEASE),
        ("term", _TERM),
        ("subscribers", _SUBSCRIBERS),
        ("load_state", _LOAD_STATE),
        ("claim", _CLAIM),
        ("unclaim", _UNCLAIM),
    )
}


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


class RedisBackend(Backend):
    """Lease store on one Redis (standalone, Sentinel-managed, Cluster, or behind TLS)."""

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        super().__init__(url, key_prefix, timeout)
        self._options = _options(url, timeout)
        self._cluster_url = _cluster_url(url)
        self._redis: Any = None
        try:
            if self._cluster_url is None:
                self._redis = _client(url, self._options)
            else:
                # Only checked here: a cluster client connects when it is built,
                # which waits for the first call (see _client_now).
                parse_url(self._cluster_url)  # type: ignore[no-untyped-call]
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"leader_url {mask_url(url)!r} is not a valid Redis URL: {exc}"
            ) from exc
        self._subscriptions: dict[str, Subscription] = {}
        #: Whether terms keep a presence: None until the first subscription
        #: has checked that this server counts it where the scripts run.
        self._presence: bool | None = None
        self._lock = threading.Lock()
        #: (when, count) of :meth:`_promotable`, asked of the sentinels.
        self._promotable_cache: tuple[float, int | None] | None = None
        #: Per election, in Cluster with "auto": (term, node, replicas) of
        #: :meth:`_replicas_in_term`.
        self._term_replicas: dict[str, tuple[str, str, int]] = {}
        #: How often a Cluster call was tried again on a refreshed slot map, and
        #: that count when each election's subscription was opened: a
        #: subscription older than the last refresh may be on a dead node.
        self._reroutes = 0
        self._subscribed_at: dict[str, int] = {}

    # -- talking to Redis -----------------------------------------------------

    def _client_now(self) -> Any:
        """The client; a Cluster client is built (and so connects) on first use."""
        client = self._redis
        if client is not None:
            return client
        assert self._cluster_url is not None
        with self._lock:
            if self._redis is None:
                self._redis = self._connect_cluster(self._cluster_url)
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

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(client, ...)``; every redis-py error becomes StoreUnavailable in one line.

        In Redis Cluster, a call that found its node gone or no longer serving
        the slot is tried again on a refreshed slot map until the store
        deadline (see :func:`_rerouted`).
        """
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return fn(self._client_now(), *args, **kwargs)
            except (redis.RedisError, RedisClusterException) as exc:
                if not _rerouted(self._redis, exc, deadline):
                    raise StoreUnavailable(_describe(exc)) from exc
                with self._lock:
                    self._reroutes += 1

    def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run script ``name`` (one round trip once the server has cached it)."""

        def run(client: Any) -> Any:
            return _eval(client, _SCRIPTS[name], keys, args)

        return self._checked(self._call(run))

    def _checked(self, reply: Any) -> Any:
        """``reply``, or the error naming the key a script found of the wrong type."""
        if isinstance(reply, list) and reply and reply[0] == "foreign":
            key, found = reply[1], reply[2]
            expected = _EXPECTED.get(key.rsplit(":", 1)[-1], "a celery-leader value")
            raise foreign(f"Redis key {key!r}", found, expected)
        return reply

    def _key(self, election: str, name: str) -> str:
        return f"{{{self.key_prefix}:{election}}}:{name}"

    # -- the protocol ---------------------------------------------------------

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        ttl_ms = max(1, int(ttl * 1000))
        lock = self._key(election, "lock")
        if self._rerouted_since(election):
            # Opened on the node the old slot map named, maybe dead: a term must
            # not name a presence that no node of the election counts.
            self._drop_subscription(election)
        subscription = self._subscription(election)
        presence = subscription.presence if subscription is not None else None
        taken, value, pttl, *watching = self._acquire_durably(
            election,
            [lock, self._key(election, "epoch"), self._key(election, "watch")],
            [
                uuid.uuid4().hex,
                instance_id,
                ttl_ms,
                min_epoch,
                presence or "",
                self._key(election, "present:"),
                "1" if self._presence else "0",
                self._key(election, "released"),
            ],
        )
        if taken:
            if presence is not None and self._rerouted_since(election):
                # The slot moved during this acquire: keep the term's presence
                # on the node that now holds it.
                self._subscription(election, presence)
            epoch = parse_term(value, f"Redis key {lock!r}")["epoch"]
            return Acquired(Term(value, epoch), None, ttl)
        info = _holder(value, pttl, lock)
        retry = ttl if pttl < 0 else pttl / 1000
        if watching and watching[0]:
            retry = min(retry, WATCH_INTERVAL)
        return Acquired(None, info, retry)

    def renew(self, election: str, term: Term, ttl: float) -> Renewal:
        code = self._script(
            "renew",
            [self._key(election, "lock"), self._key(election, "resign")],
            [term.token, max(1, int(ttl * 1000))],
        )
        return {0: Renewal.LOST, 1: Renewal.RENEWED, 2: Renewal.RESIGN}[int(code)]

    def release(self, election: str, term: Term) -> None:
        self._script(
            "release",
            [self._key(election, "lock")],
            [term.token, self._key(election, "released")],
        )

    def wait(self, election: str, timeout: float, cancel: threading.Event) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            subscription = self._subscriptions.get(election)
        if subscription is None:
            # Dropped after an error; the next acquire subscribes again.
            cancel.wait(timeout)
            return
        try:
            wait_sliced(subscription.message, timeout, cancel)
        except (redis.RedisError, RedisClusterException):
            self._drop_subscription(election)
            # Its node may be gone (a Cluster or Sentinel fail-over): ask again
            # as soon as the designated successor would, rather than at the
            # holder's ttl, so that this follower subscribes on the new node
            # and can take over a holder that dies there. A store that is down
            # fails that acquire, and the lease then backs off.
            cancel.wait(max(0.0, min(WATCH_INTERVAL, deadline - time.monotonic())))

    def hold(self, election: str, term: Term, timeout: float, cancel: threading.Event) -> bool:
        presence = parse_term(term.token, "our own term").get("presence")
        if presence is None:
            cancel.wait(timeout)
            return True
        with self._lock:
            subscription = self._subscriptions.get(election)
        if subscription is None or subscription.presence != presence:
            return False  # the connection the term names was dropped already
        try:
            wait_sliced(subscription.idle, timeout, cancel)
        except (redis.RedisError, RedisClusterException):
            self._drop_subscription(election)
            return False
        return True

    def _subscription(self, election: str, ident: str | None = None) -> Subscription | None:
        """Our subscription for ``election``, opened and confirmed first if need be.

        ``None`` when the server refuses it (ACL channel rules): then followers
        poll at the holder's ttl, and terms keep no presence. With ``ident``,
        the current one is replaced by one that keeps that presence id.
        """
        if ident is not None:
            self._drop_subscription(election)
        with self._lock:
            current = self._subscriptions.get(election)
            reroutes = self._reroutes
        if current is not None:
            return current
        released = self._key(election, "released")
        presence = None
        if self._presence is not False:
            ident = ident or uuid.uuid4().hex
            presence = (self._key(election, f"present:{ident}"), ident)
        subscription: Subscription
        try:
            subscription = self._call(Subscription.open, released, presence, self.timeout)
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, redis.ResponseError):
                raise
            self._presence_off(f"SUBSCRIBE was refused ({exc})")
            return None
        if presence is not None and self._presence is None:
            self._check_presence(election, presence[0], subscription)
        if not self._presence:
            subscription.presence = None
        with self._lock:
            self._subscriptions[election] = subscription
            self._subscribed_at[election] = reroutes
        return subscription

    def _rerouted_since(self, election: str) -> bool:
        """True when a Cluster call went to a refreshed slot map after ``election``'s
        subscription was opened."""
        with self._lock:
            return self._subscribed_at.get(election, self._reroutes) != self._reroutes

    def _check_presence(self, election: str, channel: str, subscription: Subscription) -> None:
        """Presence on, if a script on the election's node counts ``channel``'s subscriber."""
        try:
            count = self._script("subscribers", [self._key(election, "lock")], [channel])
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, redis.ResponseError):
                subscription.close()
                raise
            self._presence_off(f"PUBSUB NUMSUB in a script was refused ({exc})")
            return
        if int(count) < 1:
            self._presence_off("PUBSUB NUMSUB does not count this client's subscription there")
            return
        self._presence = True

    def _presence_off(self, why: str) -> None:
        with self._lock:
            self._presence = False
        with _FALLBACKS_LOCK:
            said = self.url in _FALLBACKS
            _FALLBACKS.add(self.url)
        if not said:
            logger.info(
                "celery-leader: Redis at %s: %s; a holder that dies is replaced when its "
                "ttl runs out, not at once",
                mask_url(self.url),
                why,
            )

    def _drop_subscription(self, election: str) -> None:
        with self._lock:
            subscription = self._subscriptions.pop(election, None)
        if subscription is not None:
            subscription.close()

    def _term(self, election: str) -> tuple[str | None, int]:
        """The stored term of ``election`` and its PTTL, in one round trip."""
        value, pttl = self._script("term", [self._key(election, "lock")], [])
        return value, pttl

    def holder(self, election: str) -> HolderInfo | None:
        value, pttl = self._term(election)
        return None if value is None else _holder(value, pttl, self._key(election, "lock"))

    def request_resign(self, election: str) -> HolderInfo | None:
        value, pttl = self._term(election)
        if value is None:
            return None
        info = _holder(value, pttl, self._key(election, "lock"))
        # Expires with the term it names, so a stale request never lingers.
        self._call(lambda c: c.set(self._key(election, "resign"), value, px=max(1, pttl)))
        return info

    def elections(self) -> list[str]:
        names = set()
        for suffix in ("epoch", "state"):
            pattern = f"{{{self.key_prefix}:*}}:{suffix}"
            for key in self._call(lambda c, p=pattern: list(c.scan_iter(match=p))):
                names.add(key[len(self.key_prefix) + 2 : -len(suffix) - 2])
        return sorted(names)

    def load_state(self, election: str) -> dict[str, str]:
        key = self._key(election, "state")
        reply = self._script("load_state", [key], [])
        if reply[0] == 0:
            return unreadable_state(f"Redis key {key!r}", f"a {reply[1]}")
        flat = reply[1:]
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def compare_and_set(
        self, election: str, term: Term, claims: Sequence[Claim]
    ) -> list[bool]:
        keys = [self._key(election, "lock"), self._key(election, "state")]
        chunks = _chunks(claims)
        calls = [
            [term.token]
            + [a for c in chunk for a in (c.entry, _has(c.expected), c.expected or "", c.new)]
            for chunk in chunks
        ]

        def run(client: Any) -> tuple[list[Any], Acks]:
            script = _SCRIPTS["claim"]
            promotable = self._promotable(client)
            with Pinned(client, keys[0]) as conn:
                replies, online = conn.scripts(
                    script.sha, script.source, keys, calls, self.replica_acks
                )
                needed = _most(online, promotable)
                needed = self._replicas_in_term(election, term.token, conn, needed)
                wrote = any(1 in reply for reply in replies)
                return replies, conn.wait(needed, self._ack_timeout) if wrote else Acks(0, 0)

        replies, acks = self._call(run)
        results: list[bool] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            # An empty reply: our term was gone, so nothing in the chunk was claimed.
            reply = self._checked(reply)
            results += [bool(r) for r in reply] if reply else [False] * len(chunk)
        if not acks.enough:
            won = [c for c, ok in zip(claims, results, strict=True) if ok]
            try:
                self._unclaim(keys, term, won)
                done = "handed back, nothing may be sent on them"
            except StoreUnavailable as exc:
                # Left claimed on the master: the slots are skipped, never sent twice.
                done = f"handing them back failed too ({exc})"
            raise self._not_replicated(acks, f"{len(won)} claim(s)", done)
        return results

    def _unclaim(self, keys: list[str], term: Term, claims: list[Claim]) -> None:
        """Put back the state that ``claims`` replaced, where they are still what is stored.

        On the master only: if a promotion undoes the claims anyway, the
        replica still has what they replaced.
        """
        calls = [
            [term.token]
            + [a for c in chunk for a in (c.entry, c.new, _has(c.expected), c.expected or "")]
            for chunk in _chunks(claims)
        ]
        script = _SCRIPTS["unclaim"]

        def run(client: Any) -> None:
            with Pinned(client, keys[0]) as conn:
                conn.scripts(script.sha, script.source, keys, calls, 0)

        self._call(run)

    def _acquire_durably(self, election: str, keys: list[str], args: list[Any]) -> list[Any]:
        """The acquire script's reply; a term it hands out is on the replicas before it counts.

        Otherwise a promoted replica would still have the previous epoch, and
        the next term would get the same one again. A term the replicas did not
        acknowledge in time is released and the call fails: nobody leads on it.
        """
        script = _SCRIPTS["acquire"]

        def run(client: Any) -> tuple[list[Any], Acks]:
            with Pinned(client, keys[0]) as conn:
                # Followers call this often; only a won term asks for the replicas.
                (reply,), _ = conn.scripts(script.sha, script.source, keys, [args], 0)
                if reply[0] != 1:
                    return reply, Acks(0, 0)
                needed = self.replica_acks
                if needed is None:
                    needed = _most(conn.online(), self._promotable(client))
                    needed = self._replicas_in_term(election, reply[1], conn, needed)
                return reply, conn.wait(needed, self._ack_timeout)

        reply, acks = self._call(run)
        reply = self._checked(reply)
        if not acks.enough:
            self.release(election, Term(reply[1], 0))
            raise self._not_replicated(acks, "a new term", "released; nobody leads on it")
        return list(reply)

    def _replicas_in_term(
        self, election: str, token: str, conn: Pinned, online: int | None
    ) -> int | None:
        """In Cluster with ``"auto"``: replicas that must acknowledge a write of term
        ``token``, ``online`` being how many the master lists online now.

        A replica whose link drops is no longer online, yet an operator (or the
        cluster) can still promote it, and a write it never got would be lost:
        so the replicas a term saw on its master stay needed for the rest of the
        term, while ``CLUSTER NODES`` still lists them for that master, not
        flagged failed (``cluster-node-timeout`` after they stop answering).
        A term on another node starts over (a promoted master without replicas
        needs none), and so does a new term: the count is kept per term and node.
        """
        if online is None or conn.node is None:
            return online
        with self._lock:
            seen = self._term_replicas.get(election)
        needed = online
        if seen is not None and seen[:2] == (token, conn.node) and seen[2] > online:
            # Only when replicas went missing: one more round trip, to the same node.
            (nodes,) = conn.send([("CLUSTER", "NODES")])
            if isinstance(nodes, NoPermissionError):
                listed = seen[2]  # nobody to ask: the replicas stay needed for the term
            elif isinstance(nodes, Exception):
                raise nodes
            else:
                listed = listed_replicas(nodes)
            needed = max(online, min(seen[2], listed))
        with self._lock:
            self._term_replicas[election] = (token, conn.node, needed)
        return needed

    def _promotable(self, client: Any) -> int | None:
        """With ``"auto"`` behind Sentinel, the replicas Sentinel could promote.

        Asked of the sentinels at most once per store deadline: a replica that
        drops out meanwhile is still waited for (claims fail, safely), one that
        joins is online, so ``ROLE`` counts it.
        """
        if self.replica_acks is not None:
            return None
        now = time.monotonic()
        with self._lock:
            cached = self._promotable_cache
        if cached is not None and now - cached[0] < self.timeout:
            return cached[1]
        count = promotable_replicas(client)
        if count is None and cached is not None:
            count = cached[1]  # no sentinel answered: they cannot promote anyone either
        with self._lock:
            self._promotable_cache = (now, count)
        return count

    @property
    def _ack_timeout(self) -> float:
        """How long a write waits for replicas: half the store deadline, so that
        handing back what they did not acknowledge still fits in the other half."""
        return self.timeout / 2

    def _not_replicated(self, acks: Acks, what: str, done: str) -> StoreUnavailable:
        if acks.needed is None:
            return StoreMisconfigured(
                f"leader_replica_acks is 'auto', which asks the Redis master how many replicas "
                f"it has (ROLE), and this user may not run ROLE ({done}): grant it +role, or "
                "set leader_replica_acks to how many replicas must acknowledge each claim"
            )
        return StoreUnavailable(
            f"{what} not on {acks.needed} replica(s) of the Redis master within "
            f"{self._ack_timeout:g} s ({acks.acked} acknowledged), so a fail-over could "
            f"undo it: {done}"
        )

    def leave(self, election: str) -> None:
        self._drop_subscription(election)

    def close(self) -> None:
        for election in list(self._subscriptions):
            self._drop_subscription(election)
        if self._redis is not None:
            self._redis.close()


def _eval(client: Any, script: _Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        # The server's script cache is empty (a start or SCRIPT FLUSH): EVAL
        # runs the script and caches it, so the next EVALSHA finds it.
        return client.eval(script.source, len(keys), *keys, *args)


#: Errors after which a Cluster client's slot map may be wrong: the node is gone
#: (killed, its replica promoted), or it says that another node serves the slot.
_REROUTE = (redis.ConnectionError, MovedError, ClusterDownError, TryAgainError)
#: Between two tries on a refreshed slot map: until the cluster has promoted a
#: replica, the map still names the dead master, and refusals come back at once.
#:
#: A Cluster master and the leader die together. The followers' subscriptions
#: close with the master; each asks again WATCH_INTERVAL later, and that call
#: keeps trying on refreshed maps until the store deadline, so a promotion
#: within the deadline costs, from the promotion:
#:   at most this pause, one CLUSTER SLOTS, the subscription and the acquire
#:   on the new master (the old term names a presence nobody keeps there) ~ 0.06 s
#: + beat's look at its lease (0.1 s) and up to one schedule period.
#: A later promotion adds up to renew_interval (ttl / 3): the lease's wait
#: after a call that failed.
#: Measured (3 beats, ttl 3 s, an entry every 0.2 s, TAKEOVER 0.02-0.06 s after
#: the kill): first dispatch 0.1-0.4 s after the kill.
_REROUTE_PAUSE = 0.05


def _rerouted(client: Any, exc: BaseException, deadline: float) -> bool:
    """True when a call that failed with ``exc`` may be tried again: the client is
    a Cluster client, ``exc`` says the slot map may be wrong, and the map was
    refreshed before ``deadline``.

    redis-py refreshes the map itself (``NodesManager.initialize``) when a
    command it routes meets a dead node, but not for a connection taken out of
    a node's pool (:class:`.redis_acks.Pinned`, which every acquire and claim
    uses so that ``WAIT`` counts their writes) nor for its pub/sub connections:
    without this, those kept going to the dead master until some other call
    happened to refresh the map. Retrying a write whose reply was lost is what
    the lease would do next anyway: acquires and renewals are fenced by the
    term, and a claim that already went through no longer matches, so it is
    skipped, never sent twice.
    """
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


def _most(online: int | None, promotable: int | None) -> int | None:
    """Replicas that must acknowledge: the larger count known; ``None`` if neither is."""
    known = [n for n in (online, promotable) if n is not None]
    return max(known) if known else None


def _chunks(claims: Sequence[Claim]) -> list[Sequence[Claim]]:
    return [claims[i : i + _CLAIM_CHUNK] for i in range(0, len(claims), _CLAIM_CHUNK)]


def _has(expected: str | None) -> str:
    """A script argument saying whether a claim expects a stored value."""
    return "0" if expected is None else "1"


def _holder(value: str, pttl: int, key: str) -> HolderInfo:
    return holder_info(value, f"Redis key {key!r}", None if pttl < 0 else pttl / 1000)


def _describe(exc: BaseException) -> str:
    """One line from a redis-py error (Cluster errors can run to many lines)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"
