"""Chaos: real ``celery beat`` and ``celery worker -B`` replicas, real stores, real faults.

Three replicas of the beat test app (tests/apps/beat_app.py) share a broker and a lease
store, two separate servers, so the store can be killed and come back (empty, for Redis;
with its tables, for PostgreSQL and MariaDB) while the messages already published stay in
the broker.
Faults: SIGKILL, SIGSTOP past the ttl, SIGTERM, a TCP proxy that stalls one replica's
store traffic past the ttl, and a store restart. A replica that exits is replaced, so
three are running at any time. Who leads is asked of the store through the library's
own backend.

How dispatch is measured: the test is the only consumer of the broker's ``celery`` list.
A thread takes every message off as soon as it lands (polling every 5 ms) and notes when;
a gap is the longest silence between two consecutive arrivals around a fault, which is
what a worker would have seen. The due time inside ``leader_slot`` would hide the gap: a
new leader sends the slot it took over late, under the slot's original time.

Checked in every test: no ``leader_slot`` is published twice, nor two slots of one entry
less than half a period apart (in case two replicas named the same slot differently).

Run with ``-s`` to see the table of measured gaps.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any

import kombu
import psycopg
import pytest
import redis

from celery_leader.backends import Fence, HolderInfo, Write, open_store
from celery_leader.exceptions import StoreUnavailable
from celery_leader.settings.config import LeaderConfig
from harness.procs import Proc, Procs
from harness.procs import signal as send_signal
from harness.proxy import TcpProxy
from harness.servers import MariaDbServer, PostgresServer, RedisServer
from harness.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timing]

CELERY = Path(sys.executable).with_name("celery")
REPO = Path(__file__).resolve().parents[1]
#: The suite's own PYTHONPATH goes first for the replicas too, so they import what it does.
PYTHONPATH = os.environ.get("PYTHONPATH")
BEAT = ["-A", "tests.apps.beat_app", "beat", "-S", "leader", "-l", "info"]
READY = r"beat: Starting\.\.\."

TTL = 3.0
EVERY = 0.2
#: How long a paused or cut-off leader stays so: well past its term.
HOLD = 2.5 * TTL
#: Longest silence allowed around a fault: the hand-over, plus up to one period
#: because the fault may strike just before a slot, which then waits for the new leader.
GRACEFUL = 0.5 + EVERY
FAILOVER = TTL + 0.5 + EVERY
#: A leader whose store connection was reset stops publishing within this.
NOTICE = 0.1

#: Asks the lease store who holds the beat election; ``None`` while it cannot say.
Holder = Callable[[], HolderInfo | None]


@dataclass(frozen=True)
class Publish:
    seen: float  # time.monotonic() when the tap took it off the broker
    slot: str | None
    epoch: int | None
    pid: int  # the publishing process, from Celery's "origin" header ("gen<pid>@host")
    #: Seconds from the slot's due time to ``seen``, on this host's wall clock; a term's
    #: smallest is its publisher's clock error (see :func:`clock_disagreement`).
    late: float | None = None


class BrokerTap:
    """The only consumer of a queue: takes each message off as it lands and notes when."""

    def __init__(self, client: redis.Redis, queue: str = "celery") -> None:
        self._client = client
        self._queue = queue
        self._lock = threading.Lock()
        self._seen: list[Publish] = []
        self._failure: Exception | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-tap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                # kombu LPUSHes, so RPOP takes the oldest message first.
                raw = self._client.rpop(self._queue, 1000)
                seen = time.monotonic()
                if not raw:
                    self._stopping.wait(0.005)
                    continue
                batch = [_parse(item, seen) for item in raw]
                with self._lock:
                    self._seen.extend(batch)
        except Exception as exc:
            self._failure = exc

    def published(self) -> list[Publish]:
        if self._failure is not None:
            raise AssertionError("the broker tap stopped") from self._failure
        with self._lock:
            return list(self._seen)

    def after(self, moment: float) -> list[Publish]:
        return [p for p in self.published() if p.seen > moment]

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)


def _parse(raw: bytes, seen: float) -> Publish:
    return _publish_of(json.loads(raw)["headers"], seen)


def _publish_of(headers: dict[str, Any], seen: float) -> Publish:
    pid = int(headers["origin"].partition("@")[0].removeprefix("gen"))
    slot = headers.get("leader_slot")
    late = None if slot is None else time.time() - due_time(slot)
    return Publish(seen, slot, headers.get("leader_epoch"), pid, late)


def due_time(slot: str) -> float:
    """The due time of a ``leader_slot`` header, in seconds since the epoch."""
    return datetime.fromisoformat(slot.partition("@")[2]).timestamp()


class AmqpTap(BrokerTap):
    """The same tap on RabbitMQ: the only consumer of the ``celery`` queue, auto-ack."""

    def __init__(self, url: str, queue: str = "celery") -> None:
        self._url = url
        self._ready = threading.Event()
        super().__init__(None, queue)  # type: ignore[arg-type]
        if not self._ready.wait(10):
            raise AssertionError("the AMQP tap did not start consuming")

    def _run(self) -> None:
        try:
            with kombu.Connection(self._url) as conn:
                channel = conn.default_channel
                # Declared as Celery declares its default queue, before any beat sends.
                queue = kombu.Queue(self._queue, kombu.Exchange(self._queue), self._queue)
                queue(channel).declare()

                def take(message: Any) -> None:
                    publish = _publish_of(message.headers, time.monotonic())
                    with self._lock:
                        self._seen.append(publish)

                channel.basic_consume(self._queue, no_ack=True, callback=take)
                self._ready.set()
                while not self._stopping.is_set():
                    try:
                        conn.drain_events(timeout=0.05)
                    except TimeoutError:
                        continue
        except Exception as exc:
            self._failure = exc


class Replicas:
    """Replicas of one celery command, one per place; the test replaces those it ends.

    Each place has its own lease store URL (through its own proxy, when the test uses
    them) and every replica its own instance id, so the store's holder names a process.
    ``{instance}`` in the command is replaced by that id.
    """

    def __init__(
        self,
        procs: Procs,
        workdir: Path,
        command: list[str],
        env: dict[str, str],
        store_urls: list[str],
        holder: Holder,
        place_env: list[dict[str, str]] | None = None,
    ) -> None:
        self._procs = procs
        #: Extra environment of each place ({instance} is replaced by the instance id).
        self._place_env = place_env or [{} for _ in store_urls]
        self._workdir = workdir
        self._command = command
        self._env = env
        self._store_urls = store_urls
        self._holder = holder
        self._spawned = 0
        self._by_instance: dict[str, tuple[int, Proc]] = {}
        self.current: list[Proc] = []

    def start(self) -> None:
        self.current = [self._spawn(place) for place in range(len(self._store_urls))]
        for proc in self.current:
            proc.wait_for_line(READY, timeout=30)

    def replace(self, place: int) -> None:
        """Start a new replica in ``place`` once its predecessor has exited."""
        self.current[place].wait(timeout=30)
        self.current[place] = self._spawn(place)
        self.current[place].wait_for_line(READY, timeout=30)

    def _spawn(self, place: int) -> Proc:
        self._spawned += 1
        instance = f"r{place}.{self._spawned}"
        proc = self._procs.spawn_python(
            CELERY,
            *(arg.format(instance=instance) for arg in self._command),
            env={
                **self._env,
                **{k: v.format(instance=instance) for k, v in self._place_env[place].items()},
                "LEADER_URL": self._store_urls[place],
                "INSTANCE_ID": instance,
                "PYTHONPATH": os.pathsep.join(filter(None, [PYTHONPATH, str(REPO)])),
            },
            cwd=self._workdir,
        )
        self._by_instance[instance] = (place, proc)
        return proc

    def instance_of(self, place: int) -> str:
        """Instance id of the replica now running in ``place``."""
        proc = self.current[place]
        return next(i for i, (_, p) in self._by_instance.items() if p is proc)

    def leader(self, timeout: float = FAILOVER + 5) -> tuple[int, Proc, int]:
        """Place, process and epoch of the holder of the beat election (waits for one)."""

        def holder() -> tuple[int, Proc, int] | None:
            info = self._holder()
            # "?": a PostgreSQL session got the lock and has not written its term yet.
            if info is None or info.instance_id == "?":
                return None
            place, proc = self._by_instance[info.instance_id]
            return place, proc, info.epoch

        return wait_for(holder, timeout, interval=0.02, message="nobody holds the beat election")


#: Largest clock disagreement between two leaders that the store clock allows: each
#: replica knows the store's time within half a round trip plus half the store's
#: resolution (etcd's HTTP ``Date`` counts whole seconds: 0.5 s; Redis, PostgreSQL and
#: MariaDB microseconds), so two replicas differ by at most 1 s plus their round
#: trips (0.1 s, far above loopback's under load).
CLOCK_SPREAD = 1.1


@dataclass
class Row:
    fault: str
    silence: float  # longest time between two arrivals around the fault
    first: float  # from the fault to the new term's first publish
    budget: float
    on: str = "silence"  # which of the two the budget applies to
    #: How much later the new term sends a slot than the old one did (see
    #: :func:`clock_disagreement`); the hand-over's gap grows by it where it is positive.
    clock: float = 0.0

    @property
    def measured(self) -> float:
        return self.silence if self.on == "silence" else self.first

    @property
    def allowed(self) -> float:
        return self.budget + max(0.0, self.clock)


def clock_disagreement(old: list[Publish], new: list[Publish]) -> float:
    """How much later than ``old``'s publisher ``new``'s sends a slot, in seconds.

    Each leader sends a slot when the store's clock, as it measured it, reaches the
    due time; a leader whose measurement runs behind its predecessor's sends every
    slot that much later, and a hand-over between them goes that much longer without
    a publish. A term's smallest lateness (arrival minus due time) is its clock
    error plus the least time a publish takes; catch-up sends of overdue slots are
    later still and never the smallest.
    """
    late_old = [p.late for p in old if p.late is not None]
    late_new = [p.late for p in new if p.late is not None]
    return min(late_new) - min(late_old) if late_old and late_new else 0.0


def measure(
    tap: BrokerTap,
    fault: str,
    at: float,
    old_epoch: int | None,
    budget: float,
    on: str = "silence",
) -> Row:
    """Wait until another term has published three times, then measure around ``at``.

    ``old_epoch`` is the term that the fault ended; ``None`` when no term survives the
    fault anyway (the store restart), so that anything published after ``at`` counts.
    """

    def new_term(p: Publish) -> bool:
        return old_epoch is None or p.epoch != old_epoch

    def third_of_new_term() -> Publish | None:
        newer = [p for p in tap.after(at) if new_term(p)]
        return newer[2] if len(newer) >= 3 else None

    until = wait_for(
        third_of_new_term,
        budget + 10,
        interval=0.02,
        message=f"{fault}: no other term published",
    ).seen
    published = tap.published()
    seen = [p.seen for p in published]
    window = [s for s in seen if s <= at][-1:] + [s for s in seen if at < s <= until]
    first_new = next(p.seen for p in published if p.seen > at and new_term(p))
    silence = max(b - a for a, b in pairwise(window))
    before = [p for p in published if p.seen <= at]
    old = [p for p in before if p.epoch == before[-1].epoch] if before else []
    new = [p for p in published if at < p.seen <= until and new_term(p)]
    return Row(fault, silence, first_new - at, budget, on, clock_disagreement(old, new))


def steady(tap: BrokerTap, count: int = 5) -> None:
    """Wait until ``count`` more messages were published (by anyone)."""
    start = time.monotonic()
    wait_for(
        lambda: len(tap.after(start)) >= count,
        FAILOVER + 10,
        interval=0.02,
        message="dispatch did not resume",
    )


def step_downs(proc: Proc) -> int:
    return sum("no longer leads 'beat'" in line for line in proc.lines())


def wait_step_down(proc: Proc, before: int) -> None:
    """Wait until ``proc`` logs that it stopped leading, ``before`` being the count so far."""
    wait_for(
        lambda: step_downs(proc) > before,
        5,
        interval=0.05,
        message=lambda: f"{proc} never stepped down:\n{proc.output()[-2000:]}",
    )


def hold_fault_until(deadline: float) -> None:
    """Keep a fault in place until ``deadline``: its length is the test's choice, not a guess."""
    time.sleep(max(0.0, deadline - time.monotonic()))


def report(
    title: str, rows: list[Row], tap: BrokerTap, ttl: float = TTL, every: float = EVERY
) -> list[str]:
    """Print the gaps measured so far (also when a phase failed); return what went wrong."""
    print(f"\n{title}, ttl {ttl:g} s, an entry every {every:g} s")
    print(
        "| fault | longest silence (s) | new term's first publish (s after) "
        "| clocks: new term sends later by (s) | budget (s) |"
    )
    print("|---|---:|---:|---:|---|")
    for row in rows:
        print(
            f"| {row.fault} | {row.silence:.3f} | {row.first:.3f} | {row.clock:+.3f} "
            f"| {row.budget:.1f} on {row.on} |"
        )
    problems = slot_problems(tap.published(), every)
    problems += [
        f"{row.fault}: {row.on} {row.measured:.3f} s > {row.budget:.1f} s"
        + (f" + {row.clock:.3f} s of clock disagreement" if row.clock > 0 else "")
        for row in rows
        if row.measured > row.allowed
    ]
    problems += [
        f"{row.fault}: the two terms' clocks disagree by {row.clock:+.3f} s (> {CLOCK_SPREAD} s)"
        for row in rows
        if abs(row.clock) > CLOCK_SPREAD
    ]
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return problems


def slot_problems(published: list[Publish], every: float = EVERY) -> list[str]:
    problems = [f"no leader headers: {p}" for p in published if p.slot is None or p.epoch is None]
    twice = {slot: n for slot, n in Counter(p.slot for p in published).items() if n > 1}
    if twice:
        problems.append(f"slots published more than once: {twice}")
    dues: dict[str, list[float]] = defaultdict(list)
    for p in published:
        if p.slot is not None:
            dues[p.slot.partition("@")[0]].append(due_time(p.slot))
    for name, times in dues.items():
        close = [(a, b) for a, b in pairwise(sorted(times)) if b - a < every / 2]
        if close:
            problems.append(f"{name}: slots due less than half a period apart: {close}")
    return problems


@pytest.fixture
def lease_store() -> Iterator[RedisServer]:
    """A redis-server for the lease alone, so restarting it empty keeps the broker's messages."""
    with RedisServer() as server:
        yield server


#: The ``broker`` parameter for RabbitMQ, marked so that ``-m rabbitmq`` selects it.
RABBITMQ = pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)


@dataclass(frozen=True)
class Broker:
    kind: str  # "redis" or "rabbitmq"
    url: str  # empty: a flushed Redis, or a fresh RabbitMQ vhost
    port: int


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Broker:
    """The beats' broker: Redis, or RabbitMQ (``parametrize("broker", [...], indirect=True)``)."""
    kind = getattr(request, "param", "redis")
    if kind == "rabbitmq":
        rabbit = request.getfixturevalue("rabbitmq_server")
        return Broker(kind, request.getfixturevalue("amqp_url"), rabbit.port)
    server = request.getfixturevalue("redis_server")
    return Broker(kind, request.getfixturevalue("redis_url"), server.port)


@pytest.fixture
def tap(broker: Broker) -> Iterator[BrokerTap]:
    """Everything published to the (empty) broker's ``celery`` queue, with arrival times."""
    if broker.kind == "rabbitmq":
        tap: BrokerTap = AmqpTap(broker.url)
    else:
        tap = BrokerTap(redis.Redis.from_url(broker.url))
    yield tap
    tap.close()


@pytest.fixture
def beat_holder() -> Iterator[Callable[[str], Holder]]:
    """Factory ``beat_holder(url) -> Holder``: the library's own backend for that store,
    asked who holds the beat election; every backend is closed at teardown."""
    backends = []

    def make(url: str) -> Holder:
        backend = open_store(LeaderConfig.from_mapping({"leader_url": url, "leader_ttl": TTL}))
        backends.append(backend)

        def holder() -> HolderInfo | None:
            try:
                return backend.lock.holder("beat")
            except StoreUnavailable:
                return None

        return holder

    yield make
    for backend in backends:
        backend.close()


def beat_env(broker_url: str, ttl: float = TTL, **extra: str) -> dict[str, str]:
    return {"BROKER_URL": broker_url, "LEADER_TTL": str(ttl), "BEAT_EVERY": str(EVERY), **extra}


def proxy_each(
    tcp_proxy: Callable[[str, int], TcpProxy], port: int, url: str, count: int = 3
) -> tuple[list[TcpProxy], list[str]]:
    """A proxy of its own per replica in front of the server at ``port``, and ``url``
    through each: a fault on ``proxies[place]`` then strikes that replica's link alone."""
    proxies = [tcp_proxy("127.0.0.1", port) for _ in range(count)]
    return proxies, [proxy.url_for(url) for proxy in proxies]


def start_beats(
    procs: Procs,
    workdir: Path,
    env: dict[str, str],
    store: RedisServer,
    holder: Holder,
    count: int = 3,
    place_env: list[dict[str, str]] | None = None,
) -> Replicas:
    """``count`` `celery beat` replicas straight on the lease ``store``, started."""
    beats = Replicas(procs, workdir, BEAT, env, [store.url] * count, holder, place_env)
    beats.start()
    return beats


def every_fault(
    store: RedisServer | PostgresServer | MariaDbServer,
    store_url: str,
    crash_budget: float,
    restarted: str,
    *,
    env: dict[str, str],
    holder: Holder,
    tcp_proxy: Callable[[str, int], TcpProxy],
    procs: Procs,
    tap: BrokerTap,
    workdir: Path,
) -> None:
    """Three `celery beat` replicas through every fault, the lease store behind a proxy each.

    ``crash_budget`` is the longest silence allowed after a SIGKILL; ``restarted`` names
    the store restart in the table (what the store has kept through a SIGKILL); ``env``
    is the replicas' (see :func:`beat_env`).
    """
    # The broker is reached directly; only the lease store goes through a proxy per replica.
    proxies, urls = proxy_each(tcp_proxy, store.port, store_url)
    beats = Replicas(procs, workdir, BEAT, env, urls, holder)
    rows: list[Row] = []
    problems: list[str] = []
    try:
        beats.start()
        steady(tap)

        place, proc, epoch = beats.leader()
        at = time.monotonic()
        send_signal(proc, signal.SIGKILL)
        rows.append(measure(tap, "crash (SIGKILL)", at, epoch, crash_budget))
        beats.replace(place)
        steady(tap)

        place, proc, epoch = beats.leader()
        at = time.monotonic()
        send_signal(proc, signal.SIGTERM)
        rows.append(measure(tap, "graceful (SIGTERM)", at, epoch, GRACEFUL))
        proc.wait_for_line(r"no longer leads 'beat' \(epoch \d+\): stopping", timeout=5)
        beats.replace(place)
        steady(tap)

        place, proc, epoch = beats.leader()
        before = step_downs(proc)
        at = time.monotonic()
        proxies[place].hold()
        rows.append(measure(tap, f"partition (store stalled {HOLD:g} s)", at, epoch, FAILOVER))
        hold_fault_until(at + HOLD)
        proxies[place].release()
        wait_step_down(proc, before)
        steady(tap)

        place, proc, epoch = beats.leader()
        before = step_downs(proc)
        at = time.monotonic()
        send_signal(proc, signal.SIGSTOP)
        rows.append(measure(tap, f"pause (SIGSTOP {HOLD:g} s)", at, epoch, FAILOVER))
        hold_fault_until(at + HOLD)
        send_signal(proc, signal.SIGCONT)
        resumed = time.monotonic()
        # Its term ran out while it was stopped: it must find that out by itself, and send
        # at most the one slot it may have claimed just before the pause.
        wait_step_down(proc, before)
        # It led until the pause and others have sent slots since: its own memory of the
        # schedule is now the stalest of the three.
        stale = place
        steady(tap)
        late = [p.slot for p in tap.after(resumed) if p.pid == proc.pid]
        if len(late) > 1:
            problems.append(f"the paused ex-leader published {late} after SIGCONT")

        _, _, epoch = beats.leader()
        killed = time.monotonic()
        store.kill()
        hold_fault_until(killed + TTL + 1.0)
        # The stale replica reaches the store first (the others' store traffic is held
        # until it leads): the order in which trusting its own memory of the schedule
        # over the store's would resend a slot.
        others = [p for p in range(3) if p != stale]
        for p in others:
            proxies[p].hold()
        restarting = time.monotonic()  # the store may answer before start() has seen it
        store.start()
        back = time.monotonic()
        rows.append(measure(tap, restarted, back, None, FAILOVER, on="first"))
        new_place, _, new_epoch = beats.leader()
        for p in others:
            proxies[p].release()
        if new_place != stale:
            problems.append(f"expected replica {stale} to lead after the restart, not {new_place}")
        if new_epoch <= epoch:
            problems.append(f"epoch went back after the store restart: {epoch} -> {new_epoch}")
        while_down = [p for p in tap.published() if killed + TTL < p.seen < restarting]
        if while_down:
            problems.append(f"published while the store was down: {while_down}")
        steady(tap)

        dead = [proc for proc in beats.current if not proc.alive]
        if dead:
            problems.append(f"replicas exited: {dead}")
    finally:
        problems += report(f"three `celery beat` replicas, {store.name} store", rows, tap)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("broker", ["redis", RABBITMQ], indirect=True)
def test_three_beats_keep_one_dispatcher_through_every_fault(
    broker: Broker,
    lease_store: RedisServer,
    beat_holder: Callable[[str], Holder],
    tcp_proxy: Callable[[str, int], TcpProxy],
    procs: Procs,
    tap: BrokerTap,
    tmp_path: Path,
) -> None:
    # A crashed holder's presence ends with its connections: no waiting for the ttl.
    every_fault(
        lease_store,
        lease_store.url,
        GRACEFUL,
        "store killed, back empty",
        env=beat_env(broker.url),
        holder=beat_holder(lease_store.url),
        tcp_proxy=tcp_proxy,
        procs=procs,
        tap=tap,
        workdir=tmp_path,
    )


#: The default ttl, and the benchmark's period: a crash must not cost either.
DEFAULT_TTL = 15.0
FAST_EVERY = 0.1
#: Longest silence around a crash or a connection reset on Redis: the designated
#: successor's check (0.15 s), beat's look at its lease (0.1 s), up to one period.
CRASH_SILENCE = 0.5


def test_three_beats_at_the_default_ttl_replace_a_crashed_leader_within_half_a_second(
    redis_url: str,
    lease_store: RedisServer,
    beat_holder: Callable[[str], Holder],
    procs: Procs,
    tap: BrokerTap,
    tmp_path: Path,
) -> None:
    """SIGKILL of the leader's process group, three times; ``benchmarks/crash_gap.py`` does ten."""
    env = beat_env(redis_url, ttl=DEFAULT_TTL, BEAT_EVERY=str(FAST_EVERY))
    beats = Replicas(
        procs, tmp_path, BEAT, env, [lease_store.url] * 3, beat_holder(lease_store.url)
    )
    rows: list[Row] = []
    try:
        beats.start()
        steady(tap)
        for _ in range(3):
            place, proc, epoch = beats.leader()
            at = time.monotonic()
            send_signal(proc, signal.SIGKILL)
            rows.append(measure(tap, "crash (SIGKILL)", at, epoch, CRASH_SILENCE))
            beats.replace(place)
            steady(tap)
    finally:
        problems = report("three `celery beat` replicas, Redis", rows, tap, DEFAULT_TTL, FAST_EVERY)
    assert not problems, "\n".join(problems)


def test_a_beat_leader_whose_store_connection_is_reset_stops_and_hands_over_at_once(
    redis_url: str,
    lease_store: RedisServer,
    beat_holder: Callable[[str], Holder],
    tcp_proxy: Callable[[str, int], TcpProxy],
    procs: Procs,
    tap: BrokerTap,
    tmp_path: Path,
) -> None:
    """The proxy closes the leader's store connections; the leader itself lives on."""
    proxies, urls = proxy_each(tcp_proxy, lease_store.port, lease_store.url)
    env = beat_env(redis_url, ttl=DEFAULT_TTL, BEAT_EVERY=str(FAST_EVERY))
    beats = Replicas(procs, tmp_path, BEAT, env, urls, beat_holder(lease_store.url))
    rows: list[Row] = []
    problems: list[str] = []
    try:
        beats.start()
        steady(tap)
        place, proc, epoch = beats.leader()
        before = step_downs(proc)
        at = time.monotonic()
        proxies[place].cut()
        rows.append(measure(tap, "connection reset", at, epoch, 1.0, on="first"))
        wait_step_down(proc, before)
        steady(tap)
        # A publish already on its way at the cut may land just after it; nothing later.
        late = [p for p in tap.after(at + NOTICE) if p.pid == proc.pid]
        if late:
            problems.append(f"the reset leader published after the cut: {late}")
        if not proc.alive:
            problems.append("the reset leader exited")
    finally:
        problems += report(
            "three `celery beat` replicas, Redis", rows, tap, DEFAULT_TTL, FAST_EVERY
        )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ],
)
def test_three_beats_on_a_sql_store_never_send_a_slot_twice(
    kind: str,
    request: pytest.FixtureRequest,
    redis_url: str,
    beat_holder: Callable[[str], Holder],
    tcp_proxy: Callable[[str, int], TcpProxy],
    procs: Procs,
    tap: BrokerTap,
    tmp_path: Path,
) -> None:
    # The server frees a crashed holder's lock when its session's socket closes, and a
    # paused or cut-off one's when the session's idle timeout (PostgreSQL's
    # idle_session_timeout, MariaDB's wait_timeout: the ttl) ends the session. A killed
    # server recovers its tables: epochs and schedule state survive the restart, because
    # the backend turns synchronous_commit on for its PostgreSQL sessions (the suite's
    # server runs with it off; see test_a_claim_acknowledged_by_postgres_survives_a_crash)
    # and the suite's MariaDB writes InnoDB's log at every commit (flushed once a second,
    # which a killed process does not need).
    server = request.getfixturevalue(f"{kind}_server")
    url = request.getfixturevalue(f"{kind}_url")
    every_fault(
        server,
        url,
        GRACEFUL,
        "store killed, back with its data",
        env=beat_env(redis_url),
        holder=beat_holder(url),
        tcp_proxy=tcp_proxy,
        procs=procs,
        tap=tap,
        workdir=tmp_path,
    )


@pytest.mark.postgres
def test_a_claim_acknowledged_by_postgres_survives_a_crash(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    """A leader publishes a slot once its claim is acknowledged: the claim must outlive a crash.

    With ``synchronous_commit=off`` (the suite's server, and a common tuning) PostgreSQL
    acknowledges a commit before its WAL is written, and a SIGKILLed server loses it; a
    leader after the restart then finds the entry's previous state and sends the slot
    again (the PostgreSQL chaos test saw it in about half its runs). Here the WAL writer
    waits 10 s instead of 0.2 s, so the loss does not depend on timing.
    """
    backend = open_store(LeaderConfig.from_mapping({"leader_url": postgres_url, "leader_ttl": TTL}))

    def admin(*statements: str) -> None:
        with psycopg.connect(postgres_server.superuser_url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def wal_writer_delay() -> str | None:
        # A new session: it starts with what the server has loaded.
        with psycopg.connect(postgres_server.superuser_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT setting FROM pg_settings WHERE name = 'wal_writer_delay'"
            ).fetchone()
        return None if row is None else str(row[0])

    try:
        term = backend.lock.acquire("beat", "r0.1", TTL, 0).term
        assert term is not None
        # Everything so far (tables, term) is on disk; the WAL writer now sleeps 10 s.
        admin("ALTER SYSTEM SET wal_writer_delay = '10s'", "SELECT pg_reload_conf()", "CHECKPOINT")
        # The server reloaded (and signalled the WAL writer, before forking new sessions).
        wait_for(lambda: wal_writer_delay() == "10000", 10, message="wal_writer_delay not 10 s")
        assert backend.records.claim(Fence("beat", term), [Write("tick", None, "slot sent")]) == [
            True
        ]
        postgres_server.kill()
        postgres_server.start()
        assert backend.records.load("beat") == {"tick": "slot sent"}
    finally:
        backend.close()
        if not postgres_server.running:
            postgres_server.start()
        admin("ALTER SYSTEM RESET wal_writer_delay", "SELECT pg_reload_conf()")


def test_embedded_beat_in_three_workers(
    redis_url: str,
    lease_store: RedisServer,
    beat_holder: Callable[[str], Holder],
    procs: Procs,
    tap: BrokerTap,
    tmp_path: Path,
) -> None:
    # `worker -S` is --statedb; the embedded beat's scheduler is --scheduler. The workers
    # consume a queue nobody publishes to, so the tap sees every task beat sends.
    workers = Replicas(
        procs,
        tmp_path,
        [
            *("-A", "tests.apps.beat_app", "worker", "-B", "--scheduler", "leader"),
            *("-Q", "nobody", "-P", "solo", "-n", "{instance}@%h", "-l", "info"),
            *("--without-mingle", "--without-gossip"),
        ],
        # The tap counts what beat publishes, and these workers run the ledger's
        # dedup step: with it on, a SIGKILL between a claim and its "sent" mark
        # would be re-sent (at least once, by design). This test is about hand-over.
        beat_env(redis_url, CELERY_LEADER_LEDGER="0"),
        [lease_store.url] * 3,
        beat_holder(lease_store.url),
    )
    rows: list[Row] = []
    problems: list[str] = []
    try:
        workers.start()
        steady(tap)
        for fault, sig, budget in [
            ("crash (SIGKILL worker and beat)", signal.SIGKILL, FAILOVER),
            ("graceful (SIGTERM worker and beat)", signal.SIGTERM, GRACEFUL),
        ]:
            place, proc, epoch = workers.leader()
            at = time.monotonic()
            send_signal(proc, sig)
            rows.append(measure(tap, fault, at, epoch, budget))
            workers.replace(place)
            steady(tap)
        dead = [proc for proc in workers.current if not proc.alive]
        if dead:
            problems.append(f"workers exited: {dead}")
    finally:
        problems += report("three `celery worker -B` replicas", rows, tap)
    assert not problems, "\n".join(problems)


def test_a_crontab_slot_across_a_failover_is_sent_exactly_once(
    redis_url: str,
    lease_store: RedisServer,
    beat_holder: Callable[[str], Holder],
    procs: Procs,
    tap: BrokerTap,
    tmp_path: Path,
) -> None:
    ttl = 2.0
    # The failover straddles the crontab entry's first slot since the replicas started,
    # the hard case: no leader has stored anything for the entry yet. So the replicas
    # start at least 6 s before a minute boundary (which costs up to 66 s of waiting).
    boundary = (int(time.time()) // 60 + 1) * 60
    if boundary - time.time() < 6:
        time.sleep(max(0.0, boundary - time.time()))  # a wait for the clock, not for an event
        boundary += 60
    beats = start_beats(
        procs,
        tmp_path,
        beat_env(redis_url, ttl=ttl, BEAT_CRONTAB="*"),
        lease_store,
        beat_holder(lease_store.url),
    )
    steady(tap)
    if time.time() > boundary - 1:
        # Only on a machine too slow to start three beats in 5 s: the failover then
        # straddles the entry's second slot, still a failover but not the hard case.
        boundary += 60
    slot_due = datetime.fromtimestamp(boundary, timezone.utc)

    def cron() -> list[Publish]:
        return [p for p in tap.published() if (p.slot or "").startswith("cron@")]

    # Crash the leader just before the slot, so the next one has to send it.
    _, first, first_epoch = beats.leader()
    time.sleep(max(0.0, boundary - 0.4 - time.time()))  # the fault's moment, on the clock
    send_signal(first, signal.SIGKILL)
    assert cron() == [], "the first leader sent the slot before it was due"
    [sent] = wait_for(cron, ttl + 3, interval=0.01, message=f"{slot_due} slot never sent")

    # Crash the one that sent it at once: the third leader must not send it again.
    _, second, second_epoch = beats.leader()
    assert sent.pid == second.pid
    send_signal(second, signal.SIGKILL)
    crashed = time.monotonic()
    wait_for(
        lambda: (
            len([p for p in tap.after(crashed) if p.epoch not in (first_epoch, second_epoch)]) >= 3
        ),
        ttl + 5,
        interval=0.02,
        message="the third leader never dispatched",
    )
    # Its first dispatch would have included the cron slot, had it been due again.
    assert cron() == [sent]
    due = due_time(sent.slot or "@")
    assert abs(due - slot_due.timestamp()) < 0.01, f"{sent.slot} is not the {slot_due} slot"
    problems = slot_problems(tap.published())
    assert not problems, "\n".join(problems)
