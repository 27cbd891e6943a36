"""The lease: who leads an election, decided in one place for beat and workers.

A :class:`Lease` runs one background thread that acquires, renews and releases
a term in a store's :class:`~celery_leader.backends.LeaseLock`. Leadership is a *validity
deadline*, never a stored flag: :meth:`Lease.is_leader` is true only while
``monotonic() < t_sent + ttl * (1 - DRIFT) - MARGIN``, where ``t_sent`` is when
the last successful acquire or renew was *sent*. The store's copy of the term
cannot expire before the store received that request (at or after ``t_sent``),
so a leader whose renewals stall, whose process is paused or whose network is
cut stops believing before the store lets anyone else in; nobody has to notice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ._urls import mask_url
from .backends import Fence, HolderInfo, LeaseLock, Renewal, Term
from .backends.lock import stored_holder
from .callbacks import NO_CALLBACKS, Callbacks, Observer
from .clock import SYSTEM_CLOCK, Clock, StoreClock
from .config import LeaderConfig, check_timing, validate_name, validity
from .exceptions import StoreUnavailable

logger = logging.getLogger(__name__)

#: Followers wake this long after the holder's term should have run out, so
#: they do not find it a hair before the store expires it.
FOLLOWER_SLACK = 0.005

#: How often a leader with a ``health_check`` asks it (a local call, no I/O),
#: so an unhealthy leader hands over within this of the check failing.
HEALTH_POLL = 0.1


class Lease:
    """Membership of one instance in one election: the elector.

    Everything it tells or asks is given at construction. ``callbacks``
    (:class:`~celery_leader.callbacks.Callbacks`) hear of transitions and of
    new leaders; ``observers`` (:class:`~celery_leader.callbacks.Observer`)
    watch its transitions and store calls (Celery's signals, metrics).
    ``health_check``, when set, is asked before every acquire and
    renewal: a non-empty answer (the reason) makes a leader step down and a
    follower stay out, so a process whose own work is stuck does not keep the
    role. ``on_cycle`` runs in the lease thread after every acquire or renew
    cycle. ``clock`` is the time it runs on (the system's unless a test gives
    another); the store's own waits (``wait``) are the store's.

    Every acquire and renewal of a store with a clock of its own samples that
    clock into :attr:`store_clock`. A local wall clock further than
    ``max_clock_skew`` seconds off it is logged (once per crossing); with
    ``clock_source="local"`` (schedules run on this host's clock) such a lease
    also gives up any term it wins until the clock is back within the bound.
    """

    #: Why the last term ended: ``"expired"``, ``"lost"``, ``"disconnected"``,
    #: ``"resigned"``, ``"stopping"``, ``"unhealthy"``, ``"error"``, or the ``kind`` given to
    #: :meth:`step_down` (beat's ``"publish_failures"``).
    last_demotion: str | None = None

    def __init__(
        self,
        election: str,
        lock: LeaseLock,
        *,
        ttl: float,
        renew_interval: float,
        instance_id: str,
        callbacks: Callbacks = NO_CALLBACKS,
        observers: Iterable[Observer] = (),
        health_check: Callable[[], str | None] | None = None,
        on_cycle: Callable[[Lease], Any] | None = None,
        deployment: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        max_clock_skew: float | None = None,
        clock_source: str = "store",
    ) -> None:
        validate_name("election", election)
        check_timing(ttl, renew_interval, "ttl", "renew_interval")
        self.election = election
        #: The store's lease lock: the one store facet the elector uses.
        self.store_lock = lock
        self.ttl = ttl
        self.renew_interval = renew_interval
        self.instance_id = instance_id
        #: This instance's deployment (its broker), stored with each of its terms.
        self.deployment = deployment
        self._foreign_epoch: int | None = None  # the foreign holder's term already warned of
        if not isinstance(callbacks, Callbacks):
            raise TypeError(f"callbacks must be a Callbacks, not {callbacks!r}")
        self.callbacks = callbacks
        self._observers = tuple(observers)
        for observer in self._observers:
            if not isinstance(observer, Observer):
                raise TypeError(f"observers must be Observer objects, not {observer!r}")
        self._health_check = health_check
        self._on_cycle = on_cycle
        #: The time this lease runs on.
        self.clock = clock
        #: The store's clock as this lease measured it (the local one until a
        #: sample, and for stores without a clock of their own).
        self.store_clock = StoreClock(clock)
        self.max_clock_skew = max_clock_skew
        self.clock_source = clock_source
        self._skewed = False  # the local clock is off by more than max_clock_skew
        self._jumps_seen = 0
        self._leader_seen: tuple[str, int] | None = None  # the last (holder, epoch) announced
        self._validity = validity(ttl)
        self._step_down_request: tuple[str, str, float] | None = None

        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._term: Term | None = None
        self._valid_until = 0.0  # monotonic deadline of our belief; 0 = follower
        self._announced = False  # on_started ran and on_stopped has not yet
        self._acked_sent = 0.0  # when the last successful acquire/renew was sent
        self._next_renew = 0.0
        self._believe_at = 0.0  # end of the store's hold-off after winning
        self._sit_out_until = 0.0
        self._max_epoch = 0  # highest epoch seen, so epochs grow even if the store forgets
        self._store_error: str | None = None

    @classmethod
    def from_config(
        cls, election: str, config: LeaderConfig, lock: LeaseLock, **options: Any
    ) -> Lease:
        """A lease with the ttl, renew interval, instance id, deployment and clock
        settings of ``config``.

        ``options`` are the constructor's others (``callbacks``, ``observers``, ``health_check``,
        ``on_cycle``, ``clock``).
        """
        return cls(
            election,
            lock,
            ttl=config.ttl,
            renew_interval=config.renew_interval,
            instance_id=config.instance_id,
            deployment=config.deployment,
            max_clock_skew=config.max_clock_skew,
            clock_source=config.clock,
            **options,
        )

    # -- what callers ask ---------------------------------------------------

    def is_leader(self) -> bool:
        """True while this instance holds a term that is still valid."""
        return self.clock.monotonic() < self._valid_until

    @property
    def valid_until(self) -> float:
        """Deadline of the current belief on :attr:`clock`'s monotonic time; 0.0 for a follower."""
        return self._valid_until

    @property
    def term(self) -> Term | None:
        """The current term while leading, else ``None``."""
        term = self._term
        return term if term is not None and self.is_leader() else None

    def fence(self) -> Fence | None:
        """The current term as a fence for the store's fenced records, while leading."""
        term = self.term
        return None if term is None else Fence(self.election, term)

    @property
    def epoch(self) -> int | None:
        """Fencing token of the current term while leading, else ``None``."""
        term = self.term
        return None if term is None else term.epoch

    @property
    def store_reachable(self) -> bool:
        """False after a store call failed, until one succeeds again."""
        return self._store_error is None

    @property
    def clock_problem(self) -> str | None:
        """Why this lease gives up terms it wins (its clock is off and schedules run
        on it, ``clock_source="local"``); ``None`` when it campaigns."""
        if not self._skewed or self.clock_source != "local":
            return None
        return (
            f"this host's clock is {-(self.store_clock.offset or 0.0):+.1f} s off the store's, "
            f"more than leader_max_clock_skew ({self.max_clock_skew:g} s), and "
            'leader_clock is "local": it does not lead until its clock is fixed'
        )

    def holder(self) -> HolderInfo | None:
        """Ask the store who holds the election now (one round trip)."""
        return self.store_lock.holder(self.election)

    @contextmanager
    def observe(self, operation: str) -> Iterator[None]:
        """Time a store call for the observers' ``on_store_call`` (``ok``: it returned)."""
        started = self.clock.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            elapsed = self.clock.monotonic() - started
            for observer in self._observers:
                if observer.on_store_call is not None:
                    self._guarded(
                        "on_store_call", observer.on_store_call, self, operation, elapsed, ok
                    )

    def step_down(self, reason: str, *, kind: str = "stepped_down", sit_out: float = 0.0) -> None:
        """Stop believing at once; release the term and sit out ``sit_out`` seconds.

        For the process that uses the lease (beat resigns after failed
        publishes). The release happens in the lease thread, within one renew
        interval; nothing is dispatched meanwhile, because the belief ends here.
        """
        with self._lock:
            if self._term is None:
                return
            self._step_down_request = (reason, kind, sit_out)
            self._valid_until = 0.0

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Join the election in a background thread (daemon). Idempotent."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"celery-leader:{self.election}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Leave the election: demote first, then release, then wake followers.

        Dispatching stops at once (``is_leader()`` turns false before anything
        else happens); releasing the term wakes a follower, which takes over
        without waiting for the ttl. Idempotent.
        """
        self._stopping.set()
        with self._lock:  # after this, the thread cannot extend the belief again
            self._valid_until = 0.0
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else self.store_lock.timeout + 1)
        self._step_down("stopping", graceful=True)
        self.store_lock.release(self.election, None)

    # -- the thread ---------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._term is None:
                    self._follow()
                else:
                    self._lead()
            except Exception:
                logger.exception("celery-leader: unexpected error in election %r", self.election)
                self._step_down("unexpected error", kind="error", sit_out=self.renew_interval)
                self.clock.wait(self.renew_interval, self._stopping)
            if self._on_cycle is not None:
                self._guarded("on_cycle", self._on_cycle, self)

    def _guarded(self, name: str, callback: Callable[..., Any], *args: Any) -> bool:
        """Run a callback; an exception is logged, never raised. Returns whether it returned."""
        try:
            callback(*args)
        except Exception:
            logger.exception("celery-leader: %s of %r failed", name, self.election)
            return False
        return True

    def _notify(self, event: str, epoch: int) -> None:
        for observer in self._observers:
            if observer.on_transition is not None:
                self._guarded("on_transition", observer.on_transition, self, event, epoch)

    def _saw_leader(self, holder: HolderInfo) -> None:
        """Tell ``on_new_leader`` of a holder (term) not seen before."""
        seen = (holder.instance_id, holder.epoch)
        if seen == self._leader_seen:
            return
        self._leader_seen = seen
        if self.callbacks.on_new_leader is not None:
            self._guarded("on_new_leader", self.callbacks.on_new_leader, self, holder)

    def _unhealthy(self) -> str | None:
        return None if self._health_check is None else self._health_check()

    def _follow(self) -> None:
        now = self.clock.monotonic()
        if now < self._sit_out_until:
            self.clock.wait(self._sit_out_until - now, self._stopping)
            return
        if self._unhealthy():
            # Campaigning now would hand the role to a process that cannot use it.
            self.clock.wait(self.renew_interval, self._stopping)
            return
        sent = self.clock.monotonic()
        try:
            with self.observe("acquire"):
                result = self.store_lock.acquire(
                    self.election,
                    stored_holder(self.instance_id, self.deployment),
                    self.ttl,
                    self._max_epoch,
                )
        except StoreUnavailable as exc:
            self._store_down(exc)
            self.clock.wait(self.renew_interval, self._stopping)
            return
        self._store_up()
        self._sample(result.store_time, sent)
        if result.holder is not None:
            self._max_epoch = max(self._max_epoch, result.holder.epoch)
            self._warn_if_foreign(result.holder)
            self._saw_leader(result.holder)
        if result.term is None:
            wait = min(max(result.retry_after, 0.0) + FOLLOWER_SLACK, self.ttl)
            self.store_lock.wait(self.election, wait, self._stopping)
            return
        with self._lock:
            self._term = result.term
        if self._stopping.is_set():
            # stop() gave up waiting for this call: hand the term straight back.
            self._step_down("stopping", graceful=True)
            return
        problem = self.clock_problem
        if problem is not None:
            # Never believed, never announced: the term goes straight back.
            self._step_down(problem, kind="clock_skew", sit_out=self.renew_interval)
            return
        self._max_epoch = max(self._max_epoch, result.term.epoch)
        self._acked_sent = sent
        self._next_renew = sent + self.renew_interval
        # A store that cannot cut an old holder off by itself makes the winner
        # wait until the old holder's belief has surely ended.
        self._believe_at = sent + self.store_lock.holdoff
        self._refresh()

    def _warn_if_foreign(self, holder: HolderInfo) -> None:
        """Say so, once per term, when the holder belongs to another deployment.

        Two deployments (brokers, vhosts) whose processes share a store and key
        prefix share every election: one of them leads nothing, and nothing
        else would tell. Holders that store no deployment (older versions) are
        not judged.
        """
        if (
            holder.deployment is None
            or self.deployment is None
            or holder.deployment == self.deployment
            or holder.epoch == self._foreign_epoch
        ):
            return
        self._foreign_epoch = holder.epoch
        logger.warning(
            "celery-leader: %s cannot lead %r: it is held by %s (epoch %d) of another "
            "deployment (broker %s; this one uses %s) that shares the store %s and key "
            "prefix. Give each deployment its own leader_key_prefix (or election names).",
            self.instance_id,
            self.election,
            holder.instance_id,
            holder.epoch,
            holder.deployment,
            self.deployment,
            mask_url(self.store_lock.url),
        )

    def _lead(self) -> None:
        now = self.clock.monotonic()
        wake = self._next_renew
        if self._announced:
            wake = min(wake, self._valid_until)
        elif self._believe_at > now:
            wake = min(wake, self._believe_at)
        if self._health_check is not None:
            wake = min(wake, now + HEALTH_POLL)
        term = self._term
        assert term is not None
        if not self.store_lock.wait(self.election, max(0.0, wake - now), self._stopping, term):
            # Another instance may take the term over now, without waiting for
            # the ttl. Sit out one interval so that one of them gets it.
            self._step_down(
                "the store closed this holder's connection",
                kind="disconnected",
                sit_out=self.renew_interval,
            )
            return
        if self._stopping.is_set():
            return
        request, self._step_down_request = self._step_down_request, None
        if request is not None:
            reason, kind, sit_out = request
            self._step_down(reason, kind=kind, sit_out=sit_out)
            return
        unhealthy = self._unhealthy()
        if unhealthy:
            self._step_down(unhealthy, kind="unhealthy", sit_out=self.renew_interval)
            return
        now = self.clock.monotonic()
        if self._announced and now >= self._valid_until:
            # Sit out one interval so that a holder that was paused or cut off
            # lets the others in rather than racing them for the term.
            self._step_down(
                f"lease expired: no renewal confirmed for {now - self._acked_sent:.2f} s "
                f"(ttl {self.ttl:g} s)",
                kind="expired",
                sit_out=self.renew_interval,
            )
            return
        if now < self._next_renew:
            self._refresh()  # the hold-off ended
            return
        sent = self.clock.monotonic()
        try:
            with self.observe("renew"):
                renewal, store_time = self.store_lock.renew(self.election, term, self.ttl)
        except StoreUnavailable as exc:
            self._store_down(exc)
            # Retry soon: the term is running out and one more try may save it.
            self._next_renew = self.clock.monotonic() + self.renew_interval / 4
            return
        self._store_up()
        self._sample(store_time, sent)
        if renewal is Renewal.LOST:
            self._step_down("lost the lease: the store no longer holds this term", kind="lost")
            return
        self._acked_sent = sent
        self._next_renew = sent + self.renew_interval
        self._refresh()
        if renewal is Renewal.RESIGN:
            # Sit out one interval so that another instance gets the term.
            self._step_down(
                "resigned on request", kind="resigned", graceful=True, sit_out=self.renew_interval
            )
            return
        problem = self.clock_problem
        if problem is not None:
            self._step_down(problem, kind="clock_skew", sit_out=self.renew_interval)

    def _sample(self, store_time: float | None, sent: float) -> None:
        """Take the store's clock from an answer to a request sent at ``sent``; say when
        it jumped and when the local clock crosses ``max_clock_skew``."""
        resolution = self.store_lock.clock_resolution
        if store_time is None or resolution is None:
            return
        clock = self.store_clock
        clock.sample(store_time, sent, self.clock.monotonic(), resolution)
        if clock.jumps != self._jumps_seen:
            self._jumps_seen = clock.jumps
            # Only schedules on the store's clock follow the jump; naming the clock
            # they run on tells an operator whether slots can stall or be missed.
            follows = (
                "now runs on the new one; slots already sent are not sent again"
                if self.clock_source == "store"
                else 'schedules on this host\'s clock (leader_clock "local")'
            )
            logger.warning(
                "celery-leader: the clock of store %s jumped %+.1f s (a fail-over to a server "
                "whose clock differs?): %r %s",
                mask_url(self.store_lock.url),
                clock.last_jump,
                self.election,
                follows,
            )
        offset, error = clock.offset, clock.error
        if self.max_clock_skew is None or offset is None or error is None:
            return
        # Only what the error bound cannot explain counts.
        skewed = abs(offset) - error > self.max_clock_skew
        if skewed != self._skewed:
            self._skewed = skewed
            if skewed:
                logger.warning(
                    "celery-leader: this host's clock is %+.1f s off the clock of store %s "
                    "(within %.3f s), more than leader_max_clock_skew (%g s)%s",
                    -offset,
                    mask_url(self.store_lock.url),
                    error,
                    self.max_clock_skew,
                    (
                        ': leader_clock is "local", so it does not lead until its clock is fixed'
                        if self.clock_source == "local"
                        else '; schedules run on the store\'s clock (leader_clock "store")'
                    ),
                )
            else:
                logger.info(
                    "celery-leader: this host's clock is back within %g s of the store's (%+.1f s)",
                    self.max_clock_skew,
                    -offset,
                )

    def _refresh(self) -> None:
        """Extend the belief after an acknowledged request, once any hold-off is over."""
        now = self.clock.monotonic()
        deadline = self._acked_sent + self._validity
        if now < self._believe_at or deadline <= now:
            return
        with self._lock:
            if self._stopping.is_set() or self._term is None or self._step_down_request:
                return
            self._valid_until = deadline
        if not self._announced:
            self._announce()

    def _announce(self) -> None:
        term = self._term
        assert term is not None
        logger.info(
            "celery-leader: %s elected leader of %r (epoch %d, ttl %g s, store %s)",
            self.instance_id,
            self.election,
            term.epoch,
            self.ttl,
            mask_url(self.store_lock.url),
        )
        started = self.callbacks.on_started
        if started is not None and not self._guarded("on_started", started, self):
            self._step_down("on_started failed", kind="error", sit_out=self.renew_interval)
            return
        with self._lock:
            # stop() may have stepped down while the callback ran: then pair the
            # callback with its on_stopped here, and announce nothing.
            current = self._term is term
            if current:
                self._announced = True
        if not current:
            if self.callbacks.on_stopped is not None:
                self._guarded("on_stopped", self.callbacks.on_stopped, self)
            return
        self._notify("elected", term.epoch)
        self._saw_leader(
            HolderInfo(self.instance_id, term.epoch, self.ttl, self.deployment, since=term.since)
        )

    def _step_down(
        self,
        reason: str,
        *,
        kind: str = "stopping",
        graceful: bool = False,
        sit_out: float = 0.0,
    ) -> None:
        """Stop believing, tell the callbacks, then release the term in the store.

        Releasing is harmless when the term was lost already (the store compares
        the exact value) and frees it at once when it was ours.
        """
        with self._lock:
            term, self._term = self._term, None
            self._valid_until = 0.0
            announced, self._announced = self._announced, False
            self._step_down_request = None
        self._sit_out_until = self.clock.monotonic() + sit_out
        if announced and term is not None:
            self.last_demotion = kind
            level = logging.INFO if graceful else logging.WARNING
            logger.log(
                level,
                "celery-leader: %s no longer leads %r (epoch %d): %s",
                self.instance_id,
                self.election,
                term.epoch,
                reason,
            )
            if self.callbacks.on_stopped is not None:
                self._guarded("on_stopped", self.callbacks.on_stopped, self)
            self._notify("demoted", term.epoch)
        if term is not None:
            try:
                with self.observe("release"):
                    self.store_lock.release(self.election, term)
            except StoreUnavailable as exc:
                logger.warning(
                    "celery-leader: could not release %r (%s); it expires within %g s",
                    self.election,
                    exc,
                    self.ttl,
                )

    def _store_down(self, exc: StoreUnavailable) -> None:
        message = str(exc)
        if message != self._store_error:
            logger.warning(
                "celery-leader: store %s unreachable or refusing for %r: %s "
                "(retrying; nobody can lead through it until it answers)",
                mask_url(self.store_lock.url),
                self.election,
                message,
            )
        self._store_error = message

    def _store_up(self) -> None:
        if self._store_error is not None:
            logger.info(
                "celery-leader: store %s answers again for %r",
                mask_url(self.store_lock.url),
                self.election,
            )
            self._store_error = None
