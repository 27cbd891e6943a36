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
* ``{p:e}:runs``   - hash of the run ledger's marks (``@...`` keys) -> JSON
* ``{p:e}:runs-expiry`` - sorted set: when each mark expires (ms, server clock)
* ``{p:e}:run:<entry>`` - hash of one entry's run records, written by workers:
  the slot's time (the key after ``<entry>@``) -> ``<tally>|<expiry>|<record>``
  (the expiry in ms by the server's clock, base 36)
* ``{p:e}:run-order:<entry>`` - list: the same slot times, oldest created first
* ``{p:e}:run-sum:<entry>`` - hash: the entry's greatest slot kept (``last``)
  and how many kept records carry each tally (``n:<tally>``)
* ``{p:e}:run-entries`` - sorted set: entries with run records -> when their
  newest expires (the three keys above expire then too)
* ``{p:e}:entries`` - hash of schedule entries, name -> JSON; edited by any
  process (no term)
* ``{p:e}:entries-version`` - counter moved by every applied entry edit
* ``{p:e}:entries-changes`` - sorted set: each recently edited entry name -> the
  version of its edit, so a reader pays for an edit what it touched

Releases and take-overs are announced on the channel ``{p:e}:released`` so
that followers act at once instead of waiting out the ttl. A holder whose
connection closed (its process died) is taken over without waiting for the
ttl: see :mod:`.presence`.

Every operation is one Lua script (:mod:`.scripts`); the client and the URL
forms are :mod:`.connection`'s. Claims and new terms are on the master's
replicas before they count (see :mod:`.acks`): a fail-over cannot undo a
claimed slot nor hand out an epoch twice.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoPermissionError, RedisClusterException

from ..._urls import mask_url
from ...exceptions import StoreMisconfigured, StoreUnavailable
from ..base import Backend
from ..errors import hand_back
from ..fenced import RUNS_DROPPED, Edit, RunSummary, Write, run_entry
from ..lock import Acquired, HolderInfo, Renewal, Term
from ..terms import holder_info, parse_term, since_of, unreadable_state
from ..waiting import wait_sliced
from .acks import Acks, Pinned, listed_replicas, promotable_replicas
from .connection import Connection
from .presence import WATCH_INTERVAL, Subscription
from .scripts import SOURCES, checked, wrong_type

logger = logging.getLogger(__name__)

#: Claims per script call: bounds how long one call blocks Redis; all chunks
#: still go out in one pipelined round trip.
_CLAIM_CHUNK = 500

#: Entries asked for per HSCAN page when reading schedule entries: at a few
#: hundred bytes an entry, a page is a few MB and milliseconds of the server's
#: time, so a million entries take 100 calls, each far inside the store deadline.
ENTRIES_PAGE = 10_000

#: Run records read per script call, and entry summaries per pipelined round
#: trip: each call is a few hundred small reads, far under a millisecond of the
#: server's time, whatever the ledger holds.
RUNS_PAGE = 500
SUMMARIES_PAGE = 200

#: Entry edits the store remembers by name: a reader that fell further behind
#: (edits of more entries than this between two of its looks, twice a second)
#: reads every entry instead. Bounds what a read of the changes returns and the
#: memory they take on the server (a sorted-set member per name).
CHANGES_KEPT = 10_000

#: Store URLs this process has said it falls back to the ttl for: once is enough
#: (a worker and its embedded beat, or many leases, each have a backend of their own).
_FALLBACKS: set[str] = set()
_FALLBACKS_LOCK = threading.Lock()


class RedisBackend(Backend):
    """Lease store on one Redis (standalone, Sentinel-managed, Cluster, or behind TLS)."""

    #: The scripts return ``TIME``: microseconds.
    clock_resolution = 1e-6

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        super().__init__(url, key_prefix, timeout)
        self._conn = Connection(url, timeout)
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
        #: Per election, the connection's reroute count when its subscription
        #: was opened: a subscription older than the last slot-map refresh may
        #: be on a dead node.
        self._subscribed_at: dict[str, int] = {}

    # -- talking to Redis -----------------------------------------------------

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
        taken, value, pttl, watching, *now = self._acquire_durably(
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
            stored = parse_term(value, f"Redis key {lock!r}")
            term = Term(value, stored["epoch"], since_of(stored))
            return Acquired(term, None, ttl, _seconds(now))
        info = _holder(value, pttl, lock)
        retry = ttl if pttl < 0 else pttl / 1000
        if watching:
            retry = min(retry, WATCH_INTERVAL)
        return Acquired(None, info, retry, _seconds(now))

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, float | None]:
        code, *now = self._conn.run(
            "renew",
            [self._key(election, "lock"), self._key(election, "resign")],
            [term.token, max(1, int(ttl * 1000))],
        )
        renewal = {0: Renewal.LOST, 1: Renewal.RENEWED, 2: Renewal.RESIGN}[int(code)]
        return renewal, _seconds(now)

    def store_time(self, election: str) -> float | None:
        return _seconds(self._conn.run("time", [self._key(election, "lock")], []))

    def release(self, election: str, term: Term) -> None:
        self._conn.run(
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
        reroutes = self._conn.reroutes
        if current is not None:
            return current
        released = self._key(election, "released")
        presence = None
        if self._presence is not False:
            ident = ident or uuid.uuid4().hex
            presence = (self._key(election, f"present:{ident}"), ident)
        subscription: Subscription
        try:
            subscription = self._conn.call(Subscription.open, released, presence, self.timeout)
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
        reroutes = self._conn.reroutes
        with self._lock:
            return self._subscribed_at.get(election, reroutes) != reroutes

    def _check_presence(self, election: str, channel: str, subscription: Subscription) -> None:
        """Presence on, if a script on the election's node counts ``channel``'s subscriber."""
        try:
            count = self._conn.run("subscribers", [self._key(election, "lock")], [channel])
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
        value, pttl = self._conn.run("term", [self._key(election, "lock")], [])
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
        self._conn.call(lambda c: c.set(self._key(election, "resign"), value, px=max(1, pttl)))
        return info

    def elections(self) -> list[str]:
        names = set()
        for suffix in ("epoch", "state"):
            pattern = f"{{{self.key_prefix}:*}}:{suffix}"
            for key in self._conn.call(lambda c, p=pattern: list(c.scan_iter(match=p))):
                names.add(key[len(self.key_prefix) + 2 : -len(suffix) - 2])
        return sorted(names)

    def load_state(self, election: str) -> dict[str, str]:
        key = self._key(election, "state")
        reply = self._conn.run("load_state", [key], [])
        if reply[0] == 0:
            return unreadable_state(f"Redis key {key!r}", f"a {reply[1]}")
        flat = reply[1:]
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def load_state_of(self, election: str, keys: Sequence[str]) -> dict[str, str] | None:
        key = self._key(election, "state")

        def read(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            pipe.type(key)
            pipe.hmget(key, list(keys))
            return list(pipe.execute(raise_on_error=False))

        kind, values = self._conn.call(read)
        if kind not in ("hash", "none"):
            return None  # not a hash: load_state reports it (and reads it as empty)
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def entries_version(self, election: str) -> int:
        key = self._key(election, "entries-version")
        return int(self._conn.call(lambda c: c.get(key)) or 0)

    def load_entries(self, election: str) -> tuple[int, dict[str, str]]:
        # Read by pages, not in one call: one HGETALL of a million entries blocked
        # the server for seconds and outlasted the socket timeout, so such a
        # schedule never loaded. The version is read before the first page: an
        # edit during the scan moves it past the one returned, and the reader
        # (schedule/feed.py) reads again at its next look. HSCAN returns every
        # entry that stays for the whole scan, so nothing unedited is missed.
        entries, version = self._key(election, "entries"), self._key(election, "entries-version")

        def head(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            pipe.type(entries)
            pipe.get(version)
            return list(pipe.execute())

        kind, number = self._conn.call(head)
        if kind not in ("hash", "none"):
            raise wrong_type(entries, kind)
        texts: dict[str, str] = {}
        cursor = 0
        while True:
            cursor, page = self._conn.call(
                lambda c, at=cursor: c.hscan(entries, at, count=ENTRIES_PAGE)
            )
            texts.update(page)
            if not cursor:
                return int(number or 0), texts

    def entries_changed_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        reply = self._conn.run("entries_since", self._entry_keys(election), [version])
        if not reply[1]:
            return None
        flat = reply[2:]
        return int(reply[0]), dict(zip(flat[::2], flat[1::2], strict=True))

    def edit_entries(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        if not edits:
            return []
        args: list[Any] = [CHANGES_KEPT]
        for e in edits:
            args += (e.key, _has(e.expected), e.expected or "", _has(e.new), e.new or "")
        return [bool(r) for r in self._conn.run("edit_entries", self._entry_keys(election), args)]

    def _entry_keys(self, election: str) -> list[str]:
        return [self._key(election, n) for n in ("entries", "entries-version", "entries-changes")]

    def compare_and_set(self, election: str, term: Term, claims: Sequence[Write]) -> list[bool]:
        keys = [self._key(election, "lock"), self._key(election, "state")]
        chunks = _chunks(claims)
        calls = [
            [term.token]
            + [a for c in chunk for a in (c.key, _has(c.expected), c.expected or "", c.new)]
            for chunk in chunks
        ]

        def run(client: Any) -> tuple[list[Any], Acks]:
            script, source = self._conn.script("claim"), SOURCES["claim"]
            promotable = self._promotable(client)
            with Pinned(client, keys[0]) as conn:
                replies, online = conn.scripts(script.sha, source, keys, calls, self.replica_acks)
                needed = _most(online, promotable)
                needed = self._replicas_in_term(election, term.token, conn, needed)
                wrote = any(1 in reply for reply in replies)
                return replies, conn.wait(needed, self._ack_timeout) if wrote else Acks(0, 0)

        replies, acks = self._conn.call(run)
        results: list[bool] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            # An empty reply: our term was gone, so nothing in the chunk was claimed.
            reply = checked(reply)
            results += [bool(r) for r in reply] if reply else [False] * len(chunk)
        if not acks.enough:
            done = hand_back(claims, results, lambda won: self._unclaim(keys, term, won))
            raise self._not_replicated(acks, f"{sum(results)} claim(s)", done)
        return results

    def _unclaim(self, keys: list[str], term: Term, claims: list[Write]) -> None:
        """Put back the state that ``claims`` replaced, where they are still what is stored.

        On the master only: if a promotion undoes the claims anyway, the
        replica still has what they replaced.
        """
        calls = [
            [term.token]
            + [a for c in chunk for a in (c.key, c.new, _has(c.expected), c.expected or "")]
            for chunk in _chunks(claims)
        ]
        script, source = self._conn.script("unclaim"), SOURCES["unclaim"]

        def run(client: Any) -> None:
            with Pinned(client, keys[0]) as conn:
                conn.scripts(script.sha, source, keys, calls, 0)

        self._conn.call(run)

    def _acquire_durably(self, election: str, keys: list[str], args: list[Any]) -> list[Any]:
        """The acquire script's reply; a term it hands out is on the replicas before it counts.

        Otherwise a promoted replica would still have the previous epoch, and
        the next term would get the same one again. A term the replicas did not
        acknowledge in time is released and the call fails: nobody leads on it.
        """
        script, source = self._conn.script("acquire"), SOURCES["acquire"]

        def run(client: Any) -> tuple[list[Any], Acks]:
            with Pinned(client, keys[0]) as conn:
                # Followers call this often; only a won term asks for the replicas.
                (reply,), _ = conn.scripts(script.sha, source, keys, [args], 0)
                if reply[0] != 1:
                    return reply, Acks(0, 0)
                needed = self.replica_acks
                if needed is None:
                    needed = _most(conn.online(), self._promotable(client))
                    needed = self._replicas_in_term(election, reply[1], conn, needed)
                return reply, conn.wait(needed, self._ack_timeout)

        reply, acks = self._conn.call(run)
        reply = checked(reply)
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

    def put_run(
        self,
        election: str,
        key: str,
        expected: str | None,
        new: str,
        ttl: float,
        *,
        keep: int = 0,
        tally: str = "",
    ) -> tuple[bool, str | None]:
        ttl_ms = max(1, math.ceil(ttl * 1000))
        entry = run_entry(key)
        if entry is None:
            args = [key, _has(expected), expected or "", new, ttl_ms]
            reply = self._conn.run("put_run", self._marks_keys(election), args)
        else:
            suffix = key[len(entry) + 1 :]
            args = [entry, key, suffix, _has(expected), expected or "", new, ttl_ms, keep]
            args += [tally, RUNS_DROPPED]
            keys = self._entry_runs_keys(election, entry)
            keys += [self._key(election, "run-entries"), *self._marks_keys(election)]
            reply = self._conn.run("put_entry_run", keys, args)
        stored = reply[1]
        return bool(int(reply[0])), None if stored in (None, False) else str(stored)

    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        keys = self._entry_runs_keys(election, entry)
        out: list[tuple[str, str]] = []
        start = 0
        while len(out) < limit:
            # A page of ranks, not of live records: an expired one is skipped,
            # so the next page starts where this one's ranks ended. Ranks count
            # from the newest created; a page is one short script.
            count = min(RUNS_PAGE, limit - len(out))
            flat = self._conn.run("runs_of", keys, [start, start + count - 1])
            out += [(f"{entry}@{flat[i]}", str(flat[i + 1])) for i in range(0, len(flat), 2)]
            start += count
            if start >= self._conn.call(lambda c: c.llen(keys[1])):
                break
        return out[:limit]

    def run_summaries(self, election: str) -> list[RunSummary]:
        index = self._key(election, "run-entries")
        now_ms = _seconds(self._conn.run("time", [self._key(election, "lock")], [])) * 1000
        out: list[RunSummary] = []
        cursor = 0
        while True:
            cursor, page = self._conn.call(
                lambda c, at=cursor: c.zscan(index, at, count=SUMMARIES_PAGE)
            )
            entries = sorted(str(e) for e, until in page if until > now_ms)
            out += self._summaries(election, entries, now_ms)
            if not cursor:
                return sorted(out, key=lambda s: s.entry)

    def _summaries(self, election: str, entries: list[str], now_ms: float) -> list[RunSummary]:
        """The summaries of ``entries``: two pipelined round trips of small reads
        (plain commands, which a Cluster pipeline sends to the election's node)."""
        keys = [self._entry_runs_keys(election, e) for e in entries]

        def sums(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for _, _, summary in keys:
                pipe.hgetall(summary)
            return list(pipe.execute())

        found = self._conn.call(sums)
        lasts = [str(f.get("last", "")) for f in found]

        def records(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for (records, _, _), last in zip(keys, lasts, strict=True):
                pipe.hget(records, last)
            return list(pipe.execute())

        read = self._conn.call(records)
        out = []
        for entry, fields, last, stored in zip(entries, found, lasts, read, strict=True):
            if not last:
                continue
            # As stored: "<tally>|<expiry, ms in base 36>|<record>".
            _, expiry, record = str(stored).split("|", 2) if stored else ("", "0", "")
            counts = {
                str(k)[2:]: int(v) for k, v in fields.items() if str(k).startswith("n:") and int(v)
            }
            live = int(expiry, 36) > now_ms
            out.append(RunSummary(entry, f"{entry}@{last}", record if live else None, counts))
        return out

    def _marks_keys(self, election: str) -> list[str]:
        return [self._key(election, "runs"), self._key(election, "runs-expiry")]

    def _entry_runs_keys(self, election: str, entry: str) -> list[str]:
        return [self._key(election, f"run{kind}:{entry}") for kind in ("", "-order", "-sum")]

    def leave(self, election: str) -> None:
        self._drop_subscription(election)

    def close(self) -> None:
        for election in list(self._subscriptions):
            self._drop_subscription(election)
        self._conn.close()


def _most(online: int | None, promotable: int | None) -> int | None:
    """Replicas that must acknowledge: the larger count known; ``None`` if neither is."""
    known = [n for n in (online, promotable) if n is not None]
    return max(known) if known else None


def _chunks(claims: Sequence[Write]) -> list[Sequence[Write]]:
    return [claims[i : i + _CLAIM_CHUNK] for i in range(0, len(claims), _CLAIM_CHUNK)]


def _has(expected: str | None) -> str:
    """A script argument saying whether a claim expects a stored value."""
    return "0" if expected is None else "1"


def _seconds(time: list[Any]) -> float:
    """Redis ``TIME`` (``[seconds, microseconds]``) as seconds since the epoch."""
    return int(time[0]) + int(time[1]) / 1e6


def _holder(value: str, pttl: int, key: str) -> HolderInfo:
    return holder_info(value, f"Redis key {key!r}", None if pttl < 0 else pttl / 1000)
