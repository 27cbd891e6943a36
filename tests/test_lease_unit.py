"""Lease state machine with the memory store and with fault-injecting fakes (in-process).

Every lease and store here runs on one :class:`~harness.manual_clock.ManualClock`:
a test moves lease time forward (``clock.run``), and nothing sleeps in real time.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from celery_leader import Lease, StoreUnavailable, signals
from celery_leader.backends import Fence, Renewal, StoreParams, Term
from celery_leader.backends.memory import _STORES, MemoryLock
from celery_leader.callbacks import Callbacks, Observer
from celery_leader.celery.signals import SIGNALS
from celery_leader.config import DRIFT, MARGIN
from harness.manual_clock import PAST, ManualClock

TTL = 0.5
RENEW = 0.15
VALIDITY = TTL * (1 - DRIFT) - MARGIN
ELECTION = "unit"


def memory(url: str, clock: ManualClock, prefix: str = "p", timeout: float = 0.1) -> MemoryLock:
    """The lease lock of the memory store ``url``, on ``clock``."""
    return MemoryLock(StoreParams(url, prefix, timeout), clock)


class Scripted(MemoryLock):
    """The memory store's lease lock, plus a call log and faults a test switches on and off."""

    def __init__(self, url: str, clock: ManualClock, prefix: str = "p", timeout: float = 0.1):
        super().__init__(StoreParams(url, prefix, timeout), clock)
        self.down = False
        self.renew_gate = threading.Event()
        self.renew_gate.set()
        self.acquire_error: Exception | None = None
        self.calls: list[tuple[str, float, dict[str, Any]]] = []
        self._log_lock = threading.Lock()

    def log(self, name: str, **detail: Any) -> None:
        with self._log_lock:
            self.calls.append((name, self.clock.monotonic(), detail))

    def names(self) -> list[str]:
        with self._log_lock:
            return [c[0] for c in self.calls]

    def _fault(self) -> None:
        if self.down:
            raise StoreUnavailable("connection refused (test)")

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Any:
        self.log("acquire", min_epoch=min_epoch, instance_id=instance_id)
        self._fault()
        if self.acquire_error is not None:
            error, self.acquire_error = self.acquire_error, None
            raise error
        return super().acquire(election, instance_id, ttl, min_epoch)

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, None]:
        self.log("renew", epoch=term.epoch)
        if not self.renew_gate.is_set():
            with self.clock.blocking(self.renew_gate):  # type: ignore[attr-defined]
                self.renew_gate.wait()
        self._fault()
        result, store_time = super().renew(election, term, ttl)
        self.log("renewed", epoch=term.epoch, result=result)
        return result, store_time

    def release(self, election: str, term: Term | None) -> None:
        if term is None:
            self.log("leave")
        else:
            self.log("release", epoch=term.epoch, holder=self.holder_or_none(election))
            self._fault()
        super().release(election, term)

    def holder_or_none(self, election: str) -> int | None:
        info = MemoryLock.holder(self, election)
        return None if info is None else info.epoch

    def wait(
        self, election: str, timeout: float, cancel: threading.Event, term: Term | None = None
    ) -> bool:
        if self.down and term is None:
            self.clock.wait(timeout, cancel)
            return True
        return super().wait(election, timeout, cancel, term)

    def forget_everything(self) -> None:
        """What a store restarted empty looks like."""
        store = self._store
        with store.cond:
            store.records.clear()
            store.epochs.clear()
            store.resign.clear()


class Watch:
    """Callbacks and signals, in the order they fired."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, int | None, float, bool]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def callbacks(self, ident: str) -> dict[str, Callable[[Lease], None]]:
        def elected(lease: Lease) -> None:
            self._add("elected", lease)

        def demoted(lease: Lease) -> None:
            self._add("demoted", lease)

        return {"on_started": elected, "on_stopped": demoted}

    def _add(self, kind: str, lease: Lease) -> None:
        with self._lock:
            self.events.append(
                (kind, lease.instance_id, lease.epoch, lease.clock.monotonic(), lease.is_leader())
            )

    def of(self, ident: str, kind: str | None = None) -> list[tuple]:
        with self._lock:
            return [e for e in self.events if e[1] == ident and (kind is None or e[0] == kind)]

    def kinds(self, ident: str) -> list[str]:
        return [e[0] for e in self.of(ident)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def url() -> Iterator[str]:
    name = f"memory://unit-{uuid.uuid4().hex[:8]}"
    yield name
    for key in [k for k in _STORES if k[0] == name]:
        del _STORES[key]


@pytest.fixture
def leases() -> Iterator[list[Lease]]:
    made: list[Lease] = []
    yield made
    for lease in made:
        lease.stop()


@pytest.fixture
def watch() -> Watch:
    return Watch()


@pytest.fixture
def signal_log() -> Iterator[list[tuple[str, str, dict[str, Any]]]]:
    seen: list[tuple[str, str, dict[str, Any]]] = []

    def on_elected(sender: str, **kwargs: Any) -> None:
        seen.append(("elected", sender, kwargs))

    def on_demoted(sender: str, **kwargs: Any) -> None:
        seen.append(("demoted", sender, kwargs))

    signals.elected.connect(on_elected, weak=False)
    signals.demoted.connect(on_demoted, weak=False)
    yield seen
    signals.elected.disconnect(on_elected)
    signals.demoted.disconnect(on_demoted)


def make(
    leases: list[Lease],
    backend: MemoryLock,
    ident: str,
    watch: Watch | None = None,
    *,
    start: bool = True,
    ttl: float = TTL,
    renew: float = RENEW,
    **callbacks: Any,
) -> Lease:
    """A lease of ``ident`` on ``backend``, on the backend's clock, sending Celery's
    signals as the leases of beat and the worker step do."""
    if watch is not None:
        callbacks = {**watch.callbacks(ident), **callbacks}
    lease = Lease(
        ELECTION,
        backend,
        ttl=ttl,
        renew_interval=renew,
        instance_id=ident,
        callbacks=Callbacks(**callbacks),
        observers=(SIGNALS,),
        clock=backend.clock,
    )
    leases.append(lease)
    if start:
        lease.start()
    return lease


def leads(lease: Lease, timeout: float = 2.0) -> None:
    """Run the clock until ``lease`` leads (``timeout`` seconds of lease time at most)."""
    clock: ManualClock = lease.clock  # type: ignore[assignment]
    clock.run_until(lease.is_leader, timeout, f"{lease.instance_id} never led")


# -- basics ----------------------------------------------------------------------


def test_single_lease_leads_and_stops(url, leases, watch, clock) -> None:
    backend = memory(url, clock)
    a = make(leases, backend, "a", watch)
    leads(a, 1)
    assert a.epoch == 1 and a.term is not None and a.term.epoch == 1
    assert a.fence() == Fence(ELECTION, a.term), "claims are fenced by the term it holds"
    assert clock.monotonic() < a.valid_until <= clock.monotonic() + VALIDITY
    holder = a.holder()
    assert holder is not None and (holder.instance_id, holder.epoch) == ("a", 1)
    # Stays leader across many renewals.
    clock.run(5 * RENEW)
    assert a.is_leader() and watch.kinds("a") == ["elected"]
    a.stop()
    assert not a.is_leader() and a.epoch is None and a.term is None and a.valid_until == 0
    assert a.fence() is None, "a follower fences nothing"
    assert watch.kinds("a") == ["elected", "demoted"]
    assert backend.holder(ELECTION) is None, "stop() released the term"
    a.stop()  # idempotent
    assert watch.kinds("a") == ["elected", "demoted"]


def test_stop_before_start_and_start_twice(url, leases, clock) -> None:
    backend = memory(url, clock)
    never = make(leases, backend, "never", start=False)
    never.stop()
    assert not never.is_leader()
    twice = make(leases, backend, "twice")
    twice.start()
    leads(twice)
    assert len([t for t in threading.enumerate() if t.name == f"celery-leader:{ELECTION}"]) == 1


def test_callbacks_and_signals_once_per_transition(url, leases, watch, signal_log, clock) -> None:
    """Hand-overs by stop(), by resign and by expiry: one callback pair per term, in order."""
    backend = Scripted(url, clock)
    a = make(leases, backend, "a", watch)
    leads(a)
    b = make(leases, backend, "b", watch)
    c = make(leases, backend, "c", watch)
    clock.run_until(lambda: backend.names().count("acquire") >= 3, 2)

    a.stop()  # graceful
    clock.run_until(lambda: b.is_leader() or c.is_leader(), 1)
    second = b if b.is_leader() else c
    third = c if second is b else b
    backend.request_resign(ELECTION)  # resign: second sits out, third takes over
    leads(third)
    hang = clock.monotonic()
    backend.renew_gate.clear()  # renewals hang: the belief runs out, then the store's term
    clock.run_until(lambda: not third.is_leader(), VALIDITY + 0.1)
    clock.run(max(0.0, hang + TTL + 0.05 - clock.monotonic()))
    backend.renew_gate.set()
    leads(second, 3)
    for lease in (second, third):
        lease.stop()

    errors = []
    for ident in "abc":
        kinds = watch.kinds(ident)
        assert kinds and kinds[0] == "elected", (ident, kinds)
        for i, kind in enumerate(kinds):
            if kind != ("elected" if i % 2 == 0 else "demoted"):
                errors.append(f"{ident}: {kinds}")
        assert kinds[-1] == "demoted", (ident, kinds)
    assert not errors
    # Never two announced leaders: walk the callbacks in time order. Only up to the
    # hang: a lease thread stuck in a store call cannot run on_stopped until the call
    # returns (is_leader() is false on time regardless; checked elsewhere).
    ordered = sorted(watch.events, key=lambda e: e[3])
    announced: set[str] = set()
    for kind, ident, _, t, _ in ordered:
        if t >= hang:
            break
        if kind == "elected":
            assert not announced, f"{ident} announced while {announced} still announced"
            announced.add(ident)
        else:
            announced.discard(ident)
    # on_started sees itself leading; on_stopped sees itself not leading.
    assert all(e[4] for e in watch.events if e[0] == "elected")
    assert not any(e[4] for e in watch.events if e[0] == "demoted")
    # Signals mirror the callbacks, with sender = election and the term's epoch.
    assert [(k, kw["instance_id"]) for k, _, kw in signal_log] == [(e[0], e[1]) for e in ordered]
    assert {sender for _, sender, _ in signal_log} == {ELECTION}
    elected_epochs = [kw["epoch"] for k, _, kw in signal_log if k == "elected"]
    assert elected_epochs == sorted(set(elected_epochs)), "epochs grow with every term"
    assert all(isinstance(kw["lease"], Lease) for _, _, kw in signal_log)


def test_at_most_one_leader_among_threads_under_churn(url, leases, clock) -> None:
    """Three leases start and stop at random; sampled whenever the threads have settled,
    and by a thread that holds the store's lock while it looks.

    Holding the store's lock freezes every acquire, renew and release, so a sample
    cannot catch one lease between releasing and another between acquiring.
    """
    backend = memory(url, clock, timeout=0.05)
    store = backend._store
    rng = random.Random(7)
    idents = ["a", "b", "c"]
    current = {i: make(leases, backend, i, ttl=0.2, renew=0.06) for i in idents}
    samples = 0
    several: list[list[str]] = []
    stop = threading.Event()

    def look() -> None:
        nonlocal samples
        with store.cond:
            who = [i for i, lease in list(current.items()) if lease.is_leader()]
        samples += 1
        if len(who) > 1:
            several.append(who)

    def sample() -> None:
        while not clock.wait(0.002, stop):  # every 2 ms of lease time
            look()

    # Named like a lease thread, so that the clock waits for each sample.
    sampler = threading.Thread(target=sample, name="celery-leader:sampler")
    sampler.start()
    try:
        end = clock.monotonic() + 2.0
        while clock.monotonic() < end:
            clock.run(rng.uniform(0.02, 0.15))
            ident = rng.choice(idents)
            current[ident].stop()
            current[ident] = make(leases, backend, ident, ttl=0.2, renew=0.06)
    finally:
        stop.set()
        sampler.join()
    assert samples > 300
    assert not several, several[:5]


def test_a_lease_reports_to_its_observers_only(url, leases, signal_log, caplog, clock) -> None:
    """No observer, no signal: a lease's reports are fixed when it is built."""
    backend = memory(url, clock)
    heard: list[tuple[str, int]] = []

    def broken(lease: Lease, operation: str, seconds: float, ok: bool) -> None:
        raise RuntimeError("observer bug")

    lease = Lease(
        ELECTION,
        backend,
        ttl=TTL,
        renew_interval=RENEW,
        instance_id="quiet",
        observers=(
            Observer(
                on_transition=lambda lease, event, epoch: heard.append((event, epoch)),
                on_store_call=broken,
            ),
        ),
        clock=clock,
    )
    leases.append(lease)
    lease.start()
    leads(lease)
    lease.stop()
    assert heard == [("elected", 1), ("demoted", 1)]
    assert signal_log == [], "signals only for leases given SIGNALS"
    assert "on_store_call of 'unit' failed" in caplog.text
    with pytest.raises(TypeError, match="observers must be Observer"):
        Lease(ELECTION, backend, ttl=TTL, renew_interval=RENEW, instance_id="x", observers=[print])  # type: ignore[list-item]


# -- on_started failures ----------------------------------------------------------


def test_on_started_raising_steps_down_releases_and_sits_out(
    url, leases, watch, signal_log, caplog, clock
) -> None:
    backend = Scripted(url, clock)
    calls: list[float] = []

    def flaky_started(lease: Lease) -> None:
        calls.append(clock.monotonic())
        if len(calls) == 1:
            raise RuntimeError("cannot start the scheduler")

    a = make(leases, backend, "a", on_started=flaky_started)
    clock.run_until(lambda: bool(calls), 1)
    b = make(leases, backend, "b", watch)
    # The failed term was released at once: b leads without waiting out the ttl.
    leads(b, 1)
    assert not a.is_leader()
    released = [c for c in backend.calls if c[0] == "release"]
    assert released and released[0][1] - calls[0] < 0.5
    assert "on_started of 'unit' failed" in caplog.text
    assert not [s for s in signal_log if s[2]["instance_id"] == "a"], "no signal for a failed term"
    # a comes back after b leaves; its second on_started succeeds.
    b.stop()
    leads(a)
    assert len(calls) == 2
    assert calls[1] - calls[0] >= RENEW, "sat out one renew interval"
    assert [s[0] for s in signal_log if s[2]["instance_id"] == "a"] == ["elected"]


def test_on_started_that_always_raises_retries_once_per_renew_interval(
    url, leases, clock
) -> None:
    backend = Scripted(url, clock)
    calls: list[float] = []

    def broken(lease: Lease) -> None:
        calls.append(clock.monotonic())
        raise RuntimeError("broken")

    stopped: list[float] = []
    a = make(leases, backend, "a", on_started=broken, on_stopped=lambda _: stopped.append(1))
    clock.run_until(lambda: len(calls) >= 5, 3)
    gaps = [y - x for x, y in itertools.pairwise(calls)]
    assert min(gaps) >= RENEW * 0.95, gaps
    # (is_leader() is true while on_started runs: the belief is set just before it.)
    clock.run_until(lambda: not a.is_leader(), 1)
    assert not stopped, "on_stopped pairs with a successful on_started only"


# -- stop() ----------------------------------------------------------------------


def test_stop_demotes_then_releases_then_wakes(url, leases, clock) -> None:
    backend = Scripted(url, clock)
    order: list[tuple[str, float, Any]] = []

    def on_stopped(lease: Lease) -> None:
        # Demoted first: not leading any more, but the store still holds our term.
        order.append(("demoted", clock.monotonic(), (lease.is_leader(), backend.holder(ELECTION))))

    # Long terms: only the release can wake b (its own retry is up to 30 s away).
    a = make(leases, backend, "a", on_stopped=on_stopped, ttl=30, renew=10)
    leads(a)
    make(
        leases,
        backend,
        "b",
        on_started=lambda lease: order.append(("b elected", clock.monotonic(), None)),
        ttl=30,
        renew=10,
    )
    clock.run_until(lambda: "acquire" in backend.names()[1:], 1)
    clock.settle()
    stopping = clock.monotonic()
    a.stop()
    stopped = clock.monotonic()
    release = [c for c in backend.calls if c[0] == "release"][-1]
    leave = [c for c in backend.calls if c[0] == "leave"][-1]
    clock.run_until(lambda: len(order) == 2, 1, f"b not woken: {order}")
    demoted, b_elected = order
    assert demoted[0] == "demoted" and b_elected[0] == "b elected"
    is_leader_then, holder_then = demoted[2]
    assert is_leader_then is False
    assert holder_then is not None and holder_then.instance_id == "a"
    assert stopping <= demoted[1] <= release[1] <= leave[1] <= stopped
    assert release[2]["holder"] == 1, "released our own, still current term"
    assert b_elected[1] >= release[1]
    assert b_elected[1] - stopped < 0.5, "the release woke the follower (its retry is 30 s away)"
    assert stopped - stopping < 0.5


def test_stop_makes_is_leader_false_before_anything_else(url, leases, clock) -> None:
    backend = Scripted(url, clock)
    seen: list[bool] = []
    entered, finish = threading.Event(), threading.Event()

    def slow_stopped(lease: Lease) -> None:
        entered.set()
        finish.wait(2)

    a = make(leases, backend, "a", on_stopped=slow_stopped)
    leads(a)
    stopper = threading.Thread(target=a.stop)
    stopper.start()
    assert entered.wait(2)
    seen.append(a.is_leader())  # while on_stopped still runs
    finish.set()
    stopper.join()
    assert seen == [False]


def test_stop_during_a_slow_on_started_still_pairs_the_callbacks(
    url, leases, watch, signal_log, clock
) -> None:
    backend = memory(url, clock)
    entered, finish = threading.Event(), threading.Event()

    def slow_started(lease: Lease) -> None:
        entered.set()
        with clock.blocking(finish):
            finish.wait(2)

    stopped: list[float] = []
    a = make(leases, backend, "a", on_started=slow_started, on_stopped=lambda _: stopped.append(1))
    clock.run_until(entered.is_set, 2)
    a.stop(timeout=0.05)  # gives up waiting for the lease thread, stuck in on_started
    finish.set()
    # on_started ran, so on_stopped runs exactly once, once the slow callback returns.
    clock.run_until(lambda: bool(stopped), 3, "on_stopped after the slow on_started")
    assert len(stopped) == 1
    kinds = [k for k, _, kw in signal_log if kw["instance_id"] == "a"]
    assert kinds in ([], ["elected", "demoted"]), kinds


# -- the store ---------------------------------------------------------------------


def test_belief_ends_at_the_deadline_while_a_renewal_hangs(url, leases, watch, clock) -> None:
    """Validity, not a flag: the lease thread is stuck, yet is_leader() turns false on time."""
    backend = Scripted(url, clock)
    a = make(leases, backend, "a", watch)
    leads(a)
    cleared = clock.monotonic()
    backend.renew_gate.clear()
    clock.run_until(
        lambda: any(c[0] == "renew" and c[1] > cleared for c in backend.calls), RENEW + 0.5
    )
    hung = next(c[1] for c in backend.calls if c[0] == "renew" and c[1] > cleared)
    # The last acknowledged renewal was sent before ``hung`` (and after cleared - RENEW):
    # the belief's deadline is fixed by it, whatever the stuck thread does.
    deadline = a.valid_until
    assert cleared - RENEW + VALIDITY - 0.02 <= deadline <= hung + VALIDITY
    clock.run_until(lambda: not a.is_leader(), VALIDITY + 1)
    assert clock.monotonic() >= deadline and a.valid_until == deadline
    assert watch.kinds("a") == ["elected"], "the stuck thread cannot have noticed yet"
    # Once the store's term has run out too, the hung renewal comes back LOST.
    clock.run(max(0.0, cleared + TTL + 0.05 - clock.monotonic()))
    backend.renew_gate.set()
    clock.run_until(lambda: watch.kinds("a")[:2] == ["elected", "demoted"], 1)
    assert watch.of("a", "demoted")[0][3] >= cleared + TTL


def test_store_errors_mean_nobody_leads_then_recovery(url, leases, watch, caplog, clock) -> None:
    backend = Scripted(url, clock)
    caplog.set_level(logging.INFO, logger="celery_leader")
    a = make(leases, backend, "a", watch)
    leads(a)
    b = make(leases, backend, "b", watch)
    clock.run_until(lambda: "acquire" in backend.names()[1:], 1)

    down = clock.monotonic()
    backend.down = True
    deadlines: list[float] = []

    def ended() -> bool:
        deadlines.append(a.valid_until)
        return not a.is_leader()

    clock.run_until(ended, TTL + 1, "a still leads after the store went away")
    # No renewal sent after ``down`` succeeded: the belief ended within the ttl.
    assert max(deadlines) <= down + VALIDITY < down + TTL
    clock.run_until(lambda: watch.kinds("a") == ["elected", "demoted"], 0.5)
    # Nobody leads while the store is down, for two ttls: looked at after every step.

    def somebody_leads() -> bool:
        return a.is_leader() or b.is_leader()

    assert not clock.run(2 * TTL, until=somebody_leads)
    up = clock.monotonic()
    backend.down = False
    clock.run_until(somebody_leads, RENEW + 0.5)
    recovered = clock.monotonic() - up
    assert recovered <= RENEW + 0.5
    new = a if a.is_leader() else b
    assert new.epoch == 2
    # One warning per lease for the outage (not one per retry), and a note when it ends.
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(unreachable) == 2 and all(r.levelno == logging.WARNING for r in unreachable)
    clock.run_until(lambda: caplog.text.count("answers again") >= 1, 1)


def test_epochs_grow_past_a_store_that_forgot(url, leases, watch, clock) -> None:
    """A store restarted empty would start epochs at 1 again; min_epoch prevents it."""
    backend = Scripted(url, clock)
    a = make(leases, backend, "a", watch)
    leads(a)
    b = make(leases, backend, "b", watch)
    clock.run_until(lambda: "acquire" in backend.names()[1:], 1)
    a.stop()
    leads(b)
    assert b.epoch == 2
    old = b.epoch
    backend.forget_everything()
    # b's next renewal finds the term gone (LOST): it steps down and takes a new term.
    clock.run_until(lambda: watch.kinds("b")[:2] == ["elected", "demoted"], RENEW + 0.2)
    leads(b)
    assert b.epoch == old + 1
    acquires = [c[2]["min_epoch"] for c in backend.calls if c[0] == "acquire"]
    assert acquires[-1] == old, "the acquire passed the highest epoch seen"


def test_follower_carries_the_highest_epoch_it_saw(url, leases, clock) -> None:
    backend = Scripted(url, clock)
    a = make(leases, backend, "a")
    leads(a)
    # Push the epoch up: a few quick terms of a.
    for _ in range(3):
        backend.request_resign(ELECTION)
        clock.run_until(lambda: not a.is_leader(), 1)
        leads(a)
    high = a.epoch
    assert high == 4
    b = make(leases, backend, "b")
    clock.run_until(lambda: any(c[2].get("instance_id") == "b" for c in backend.calls), 1)
    backend.forget_everything()
    a.stop()
    leads(b)
    assert b.epoch is not None and b.epoch > high


def test_renewal_lost_to_another_term_steps_down(url, leases, watch, clock) -> None:
    backend = Scripted(url, clock)
    a = make(leases, backend, "a", watch)
    leads(a)
    backend.forget_everything()
    intruder = backend.acquire(ELECTION, "intruder", 30, 0)
    assert intruder.term is not None
    clock.run_until(lambda: watch.kinds("a") == ["elected", "demoted"], RENEW + 0.2)
    assert not a.is_leader()
    renewals = [c for c in backend.calls if c[0] == "renewed"]
    assert renewals[-1][2]["result"] is Renewal.LOST
    assert backend.holder(ELECTION).instance_id == "intruder", "a released nothing of theirs"


class Disconnecting(Scripted):
    """A store whose holder's ``wait`` reports its connection gone once ``gone`` is set."""

    def __init__(self, url: str, clock: ManualClock) -> None:
        super().__init__(url, clock)
        self.gone = threading.Event()

    def wait(
        self, election: str, timeout: float, cancel: threading.Event, term: Term | None = None
    ) -> bool:
        if term is None:
            return super().wait(election, timeout, cancel)
        self.clock.wait(timeout, self.gone, cancel)
        return not self.gone.is_set()


def test_a_holder_whose_connection_is_gone_stops_believing_at_once(
    url, leases, watch, clock
) -> None:
    backend = Disconnecting(url, clock)
    a = make(leases, backend, "a", watch, renew=TTL / 3)
    leads(a)
    epoch = a.epoch
    gone = clock.monotonic()
    backend.gone.set()
    clock.run_until(lambda: watch.kinds("a") == ["elected", "demoted"], 0.1)
    demoted = watch.of("a", "demoted")[0]
    assert demoted[3] - gone < 0.05, "not at the next renewal: at once"
    assert not a.is_leader() and a.last_demotion == "disconnected"
    released = [c for c in backend.calls if c[0] == "release"]
    assert released and released[-1][2]["epoch"] == epoch, "it hands its term back"


def test_resign_hands_over(url, leases, watch, clock) -> None:
    backend = Scripted(url, clock)
    a = make(leases, backend, "a", watch)
    leads(a)
    b = make(leases, backend, "b", watch)
    clock.run_until(lambda: "acquire" in backend.names()[1:], 1)
    asked = clock.monotonic()
    holder = backend.request_resign(ELECTION)
    assert holder is not None and holder.instance_id == "a"
    leads(b, RENEW + 0.3)
    assert clock.monotonic() - asked < RENEW + 0.5
    assert b.epoch == 2
    assert watch.kinds("a") == ["elected", "demoted"]
    # a sat out and now follows; it does not take the term back.
    clock.run(RENEW * 2)
    assert b.is_leader() and not a.is_leader()
    assert backend.request_resign("nobody-holds-this") is None


def test_unexpected_backend_error_does_not_kill_the_lease(url, leases, caplog, clock) -> None:
    backend = Scripted(url, clock)
    backend.acquire_error = KeyError("bug in a backend")
    a = make(leases, backend, "a")
    leads(a, RENEW + 1)
    assert "unexpected error in election 'unit'" in caplog.text


def test_memory_store_is_per_url_and_prefix(url, leases, clock) -> None:
    one = make(leases, memory(url, clock), "one")
    other_prefix = make(leases, memory(url, clock, "q"), "other-prefix")
    other_url = make(leases, memory(url + "-2", clock), "other-url")
    for lease in (one, other_prefix, other_url):
        leads(lease)


def test_renew_interval_close_to_ttl_does_not_flap(url, leases, watch, clock) -> None:
    """The longest renew interval the settings accept for a 0.5 s ttl: every renewal
    lands just in time, and the belief never lapses.

    What it checks is arithmetic: a renewal sent at ``t`` makes the belief last until
    ``t + VALIDITY`` (0.5 s less 1 % drift less 5 ms = 0.49 s) and the next renewal
    goes out at ``t + 0.48``, so each one finds ``VALIDITY - 0.48`` = 10 ms of belief
    left. On the manual clock that margin is exact: time moves only while the lease
    thread waits, and then to its deadline plus ``PAST`` (1 microsecond), so every
    renewal finds 10 ms less 1 microsecond of lease time left, however loaded the
    machine. (The test's first version slept on the real clock; there the 10 ms were
    the time the OS had to wake the lease thread, and a thread woken 10 ms late
    rightly stepped down, "lease expired".)
    """
    renew = 0.48
    margin = VALIDITY - renew
    backend = memory(url, clock)
    left: list[float] = []  # belief left when each renewal went out
    original = backend.renew

    def renew_call(*args: Any, **kwargs: Any) -> Any:
        left.append(a.valid_until - clock.monotonic())
        return original(*args, **kwargs)

    backend.renew = renew_call  # type: ignore[method-assign]
    a = make(leases, backend, "a", watch, ttl=TTL, renew=renew)
    leads(a)
    lapsed: list[float] = []

    def four_renewals() -> bool:
        # Looked at after every step of the clock: whenever the belief could change.
        if not a.is_leader():
            lapsed.append(clock.monotonic())
        return len(left) >= 4

    clock.run_until(four_renewals, 4.0, "four renewals")
    assert lapsed == []
    assert left == pytest.approx([margin - PAST] * 4, abs=1e-9)
    assert watch.kinds("a") == ["elected"]


# -- new leaders seen -----------------------------------------------------------------


def test_new_leaders_are_seen_by_followers_and_by_the_leader_itself(url, leases, clock) -> None:
    backend = memory(url, clock)
    seen: list[tuple[str, str, int]] = []

    def saw(ident: str) -> Callable[[Lease, Any], None]:
        return lambda lease, holder: seen.append((ident, holder.instance_id, holder.epoch))

    a = make(leases, backend, "a", on_new_leader=saw("a"))
    leads(a)
    b = make(leases, backend, "b", on_new_leader=saw("b"))
    clock.run(3 * RENEW)  # b asks many times: it is told once per term
    assert seen == [("a", "a", 1), ("b", "a", 1)]
    a.stop()
    leads(b)
    assert seen[2:] == [("b", "b", 2)]
    broken = make(leases, backend, "c", on_new_leader=lambda *_: 1 / 0)
    clock.run(3 * RENEW)  # an error in on_new_leader is logged; the follower goes on
    assert not broken.is_leader() and b.is_leader()


# -- deployments sharing a store (issue 19) ----------------------------------------


def test_a_follower_names_a_holder_of_another_deployment_once_per_term(
    url, leases, caplog, clock
) -> None:
    backend = memory(url, clock)

    def lease(ident: str, deployment: str) -> Lease:
        made = Lease(
            ELECTION,
            backend,
            ttl=TTL,
            renew_interval=RENEW,
            instance_id=ident,
            deployment=deployment,
            clock=clock,
        )
        leases.append(made)
        return made

    a = lease("a", "amqp://h:5672/A")
    same = lease("s", "amqp://h:5672/A")
    other = lease("o", "amqp://h:5672/B")
    a.start()
    leads(a, 1)
    holder = a.holder()
    assert holder is not None
    assert (holder.instance_id, holder.deployment) == ("a", "amqp://h:5672/A")
    started = clock.monotonic()
    with caplog.at_level(logging.WARNING, logger="celery_leader"):
        same.start()
        other.start()
        clock.run_until(lambda: "another deployment" in caplog.text, TTL, "no warning")
        waited = clock.monotonic() - started
        clock.run(3 * RENEW)  # followers retry meanwhile: still one line
    lines = [r.getMessage() for r in caplog.records if "another deployment" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("celery-leader: o cannot lead")
    assert "held by a (epoch 1)" in lines[0] and "amqp://h:5672/A" in lines[0]
    assert waited < TTL
