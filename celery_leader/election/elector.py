"""The elector: an explicit state, and the acquire, renew and release loop.

Leading is a deadline, never a stored flag (:mod:`.timing` derives it), so
:meth:`Elector.is_leader` turns false on time however stuck the thread is.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..backends import Fence, HolderInfo, LeaseLock, Renewal, Term
from ..backends.lock import stored_holder
from ..backends.urls import mask_url
from ..clock import Clock
from ..exceptions import StoreUnavailable
from .events import Events
from .members import guarded
from .timing import FOLLOWER_SLACK, HEALTH_POLL, check_timing, validity

logger = logging.getLogger(__name__)


class State(enum.Enum):
    """Where the elector's thread is."""

    FOLLOWING = "following"  # no term: campaigning
    LEADING = "leading"  # holds a term, believed once any hold-off is over
    STEPPING_DOWN = "stepping down"  # believes no more; telling, then releasing
    SITTING_OUT = "sitting out"  # not campaigning for a while, so that another instance wins


class Elector:
    """The thread that campaigns for one instance in one election, and its state.
    It tells ``listeners`` every :class:`~.events.Events` event, in order; with
    ``polls_health`` a leader asks their ``problem()`` every ``HEALTH_POLL``."""

    #: Why the last term ended: ``"expired"``, ``"lost"``, ``"disconnected"``,
    #: ``"resigned"``, ``"stopping"``, ``"unhealthy"``, ``"error"``, ``"clock_skew"``,
    #: or the ``kind`` given to :meth:`step_down` (beat's ``"publish_failures"``).
    last_demotion: str | None = None

    def __init__(
        self,
        election: str,
        lock: LeaseLock,
        ttl: float,
        renew_interval: float,
        instance_id: str,
        deployment: str | None,
        clock: Clock,
        listeners: tuple[Events, ...],
        polls_health: bool,
    ) -> None:
        check_timing(ttl, renew_interval, "ttl", "renew_interval")
        self.election, self.store_lock, self.instance_id = election, lock, instance_id
        self.ttl, self.renew_interval = ttl, renew_interval
        #: This instance's deployment (its broker), stored with each of its terms.
        self.deployment = deployment
        #: The time it runs on; the store's own waits are the store's.
        self.clock = clock
        self._listeners, self._polls_health = listeners, polls_health
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = State.FOLLOWING
        self._term: Term | None = None
        self._announced = False  # on_started ran and on_stopped has not yet
        self._valid_until = 0.0  # monotonic deadline of the belief; 0: none
        self._acked_sent = 0.0  # when the last acknowledged acquire or renewal was sent
        self._next_renew = self._believe_at = self._sit_out_until = 0.0
        self._step_down_request: tuple[str, str, float] | None = None
        self._max_epoch = 0  # highest epoch seen, so epochs grow even if the store forgets
        self._leader_seen: tuple[str, int] | None = None  # the last (holder, epoch) told

    @property
    def state(self) -> State:
        """Where the thread is; whether this instance leads is :meth:`is_leader`."""
        return self._state

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

    @contextmanager
    def observe(self, operation: str) -> Iterator[None]:
        """Time a store call for the listeners' ``on_store_call``."""
        started = self.clock.monotonic()
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._tell("on_store_call", operation, self.clock.monotonic() - started, error)

    def step_down(self, reason: str, *, kind: str = "stepped_down", sit_out: float = 0.0) -> None:
        """Stop believing at once; release the term and sit out ``sit_out`` seconds. The
        release happens in the thread, within one renew interval; the belief ends here."""
        with self._lock:
            if self._state is State.LEADING:
                self._step_down_request = (reason, kind, sit_out)
                self._valid_until = 0.0

    def start(self) -> None:
        """Join the election in a background thread (daemon). Idempotent."""
        if self._thread is None:
            name = f"celery-leader:{self.election}"
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Leave the election: demote first, then release (waking a follower, which takes
        over without waiting for the ttl). Idempotent."""
        self._stopping.set()
        with self._lock:  # after this, the thread cannot extend the belief again
            self._valid_until = 0.0
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else self.store_lock.timeout + 1)
        self._step_down("stopping", graceful=True)
        self.store_lock.release(self.election, None)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._state is State.LEADING:
                    self._lead()
                else:
                    self._follow()
            except Exception:
                logger.exception("celery-leader: unexpected error in election %r", self.election)
                self._step_down("unexpected error", kind="error", sit_out=self.renew_interval)
                self.clock.wait(self.renew_interval, self._stopping)
            self._tell("on_cycle")

    def _tell(self, event: str, *args: Any) -> bool:
        """Tell every listener ``event``; whether none raised (each raise is logged)."""
        told = [guarded(event, self, getattr(each, event), self, *args) for each in self._listeners]
        return all(told)

    def _problem(self) -> str | None:
        return next(filter(None, (each.problem() for each in self._listeners)), None)

    def _saw(self, holder: HolderInfo) -> None:
        """Tell ``on_new_leader`` of a holder (term) not seen before."""
        if (holder.instance_id, holder.epoch) != self._leader_seen:
            self._leader_seen = (holder.instance_id, holder.epoch)
            self._tell("on_new_leader", holder)

    def _follow(self) -> None:
        now = self.clock.monotonic()
        if self._state is State.SITTING_OUT:
            if now < self._sit_out_until:
                self.clock.wait(self._sit_out_until - now, self._stopping)
                return
            self._state = State.FOLLOWING
        if self._problem():
            # Campaigning now would hand the role to a process that cannot use it.
            self.clock.wait(self.renew_interval, self._stopping)
            return
        sent = self.clock.monotonic()
        holder = stored_holder(self.instance_id, self.deployment)
        try:
            with self.observe("acquire"):
                result = self.store_lock.acquire(self.election, holder, self.ttl, self._max_epoch)
        except StoreUnavailable:  # the outage listener says so, once
            self.clock.wait(self.renew_interval, self._stopping)
            return
        if result.term is not None:
            with self._lock:
                self._term, self._state = result.term, State.LEADING
        self._tell("on_answer", sent, result.store_time)  # a listener may step down
        if result.holder is not None:
            self._max_epoch = max(self._max_epoch, result.holder.epoch)
            self._saw(result.holder)
        if result.term is None:
            wait = min(max(result.retry_after, 0.0) + FOLLOWER_SLACK, self.ttl)
            self.store_lock.wait(self.election, wait, self._stopping)
        elif self._stopping.is_set():
            # stop() gave up waiting for this call: hand the term straight back.
            self._step_down("stopping", graceful=True)
        elif not self._stepped_down_on_request():  # (then never believed nor announced)
            self._max_epoch = max(self._max_epoch, result.term.epoch)
            self._acked_sent, self._next_renew = sent, sent + self.renew_interval
            # A store that cannot cut an old holder off by itself makes the winner
            # wait until the old holder's belief has surely ended.
            self._believe_at = sent + self.store_lock.holdoff
            self._refresh()

    def _lead(self) -> None:
        term = self._term
        assert term is not None
        now = self.clock.monotonic()
        wake = self._next_renew
        if self._announced:
            wake = min(wake, self._valid_until)
        elif self._believe_at > now:
            wake = min(wake, self._believe_at)
        if self._polls_health:
            wake = min(wake, now + HEALTH_POLL)
        if not self.store_lock.wait(self.election, max(0.0, wake - now), self._stopping, term):
            # Another instance may take the term over now, without waiting for
            # the ttl. Sit out one interval so that one of them gets it.
            reason = "the store closed this holder's connection"
            self._step_down(reason, kind="disconnected", sit_out=self.renew_interval)
            return
        if self._stopping.is_set() or self._stepped_down_on_request():
            return
        unhealthy = self._problem()
        now = self.clock.monotonic()
        if unhealthy:
            self._step_down(unhealthy, kind="unhealthy", sit_out=self.renew_interval)
        elif self._announced and now >= self._valid_until:
            # Sit out one interval so that a holder that was paused or cut off
            # lets the others in rather than racing them for the term.
            reason = f"no renewal confirmed for {now - self._acked_sent:.2f} s"
            reason = f"lease expired: {reason} (ttl {self.ttl:g} s)"
            self._step_down(reason, kind="expired", sit_out=self.renew_interval)
        elif now < self._next_renew:
            self._refresh()  # the hold-off ended
        else:
            self._renew(term)

    def _renew(self, term: Term) -> None:
        sent = self.clock.monotonic()
        try:
            with self.observe("renew"):
                renewal, store_time = self.store_lock.renew(self.election, term, self.ttl)
        except StoreUnavailable:
            # Retry soon: the term is running out and one more try may save it.
            self._next_renew = self.clock.monotonic() + self.renew_interval / 4
            return
        self._tell("on_answer", sent, store_time)  # a listener may step down
        if renewal is Renewal.LOST:
            self._step_down("lost the lease: the store no longer holds this term", kind="lost")
            return
        self._acked_sent, self._next_renew = sent, sent + self.renew_interval
        self._refresh()
        if renewal is Renewal.RESIGN:
            # Sit out one interval so that another instance gets the term.
            reason, interval = "resigned on request", self.renew_interval
            self._step_down(reason, kind="resigned", graceful=True, sit_out=interval)
        else:
            self._stepped_down_on_request()

    def _stepped_down_on_request(self) -> bool:
        """Step down if :meth:`step_down` asked to since the thread last looked."""
        request, self._step_down_request = self._step_down_request, None
        if request is not None:
            self._step_down(request[0], kind=request[1], sit_out=request[2])
        return request is not None

    def _refresh(self) -> None:
        """Extend the belief after an acknowledged request, once any hold-off is over."""
        now = self.clock.monotonic()
        deadline = self._acked_sent + validity(self.ttl)
        if now < self._believe_at or deadline <= now:
            return
        with self._lock:
            if self._stopping.is_set() or self._state is not State.LEADING:
                return
            if self._step_down_request is not None:
                return
            self._valid_until = deadline
        if not self._announced:
            self._announce(self._term)

    def _announce(self, term: Term | None) -> None:
        assert term is not None
        msg = "celery-leader: %s elected leader of %r (epoch %d, ttl %g s, store %s)"
        store = mask_url(self.store_lock.url)
        logger.info(msg, self.instance_id, self.election, term.epoch, self.ttl, store)
        if not self._tell("on_started"):
            self._step_down("on_started failed", kind="error", sit_out=self.renew_interval)
            return
        with self._lock:
            # stop() may have stepped down while the callbacks ran: then pair
            # them with on_stopped here, and announce nothing.
            current = self._announced = self._term is term
        if not current:
            self._tell("on_stopped")
            return
        self._tell("on_transition", "elected", term.epoch)
        own = HolderInfo(self.instance_id, term.epoch, self.ttl, self.deployment, since=term.since)
        self._saw(own)

    def _step_down(
        self, reason: str, *, kind: str = "stopping", graceful: bool = False, sit_out: float = 0.0
    ) -> None:
        """Stop believing, tell the listeners, then release the term in the store
        (harmless when it was lost already: the store compares the exact value)."""
        with self._lock:
            term, self._term, self._state = self._term, None, State.STEPPING_DOWN
            announced, self._announced = self._announced, False
            self._valid_until, self._step_down_request = 0.0, None
        self._sit_out_until = self.clock.monotonic() + sit_out
        if announced and term is not None:
            self.last_demotion = kind
            logger.log(
                logging.INFO if graceful else logging.WARNING,
                "celery-leader: %s no longer leads %r (epoch %d): %s",
                self.instance_id,
                self.election,
                term.epoch,
                reason,
            )
            self._tell("on_stopped")
            self._tell("on_transition", "demoted", term.epoch)
        if term is not None:
            try:
                with self.observe("release"):
                    self.store_lock.release(self.election, term)
            except StoreUnavailable as exc:
                msg = "celery-leader: could not release %r (%s); it expires within %g s"
                logger.warning(msg, self.election, exc, self.ttl)
            if announced:
                self._tell("on_released", term.epoch, kind)
        with self._lock:
            # stop() may step down while the thread wins a term: the thread keeps
            # that one and, seeing _stopping, hands it straight back.
            if self._term is None:
                self._state = State.SITTING_OUT if sit_out > 0 else State.FOLLOWING
