"""How followers wait: in slices until a deadline or a cancel, and queued for a lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

#: Longest a follower's wait goes without looking at its ``cancel`` event.
CANCEL_POLL = 0.05

R = TypeVar("R")


def wait_sliced(ready: Callable[[float], bool], timeout: float, cancel: threading.Event) -> None:
    """Block until ``ready(seconds)`` says so, ``timeout`` passes or ``cancel`` is set,
    in slices of :data:`CANCEL_POLL` so that a stopping lease is never held up."""
    deadline = time.monotonic() + timeout
    while not cancel.is_set():
        left = deadline - time.monotonic()
        if left <= 0 or ready(min(left, CANCEL_POLL)):
            return


class LockWaiter(Generic[R]):
    """A daemon thread queued for a store lock on behalf of a follower.

    ``wait(resource, cancelled)`` blocks on ``resource`` until the store grants the lock;
    the thread then parks the resource, lock held, for the next ``acquire``
    (:meth:`take`); :attr:`done` is set either way. A waiter cancelled drops it."""

    def __init__(
        self,
        resource: R,
        wait: Callable[[R, threading.Event], bool],
        drop: Callable[[R], None],
        *,
        name: str,
        interrupt: Callable[[R], None] | None = None,
    ) -> None:
        #: Set when the wait is over: the lock was granted, or the wait failed.
        self.done = threading.Event()
        self._wait = wait
        self._drop = drop
        self._interrupt = interrupt
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._resource: R | None = resource  # ours until taken or dropped
        self._won = False
        self._finished = False
        threading.Thread(target=self._run, args=(resource,), name=name, daemon=True).start()

    def _run(self, resource: R) -> None:
        won = self._wait(resource, self._cancelled)
        with self._lock:
            self._finished = True
            self._won = won and not self._cancelled.is_set()
            dropped = not self._won
            if dropped:
                self._resource = None
        if dropped:
            self._drop(resource)
        self.done.set()

    def take(self) -> R | None:
        """The resource, now holding the lock, if the waiter won it; else ``None``."""
        with self._lock:
            if not self._won:
                return None
            self._won = False
            resource, self._resource = self._resource, None
            return resource

    def cancel(self) -> None:
        """Leave the queue; a lock won meanwhile is dropped with its resource."""
        with self._lock:
            self._cancelled.set()
            resource = self._resource
            if resource is None:
                return
            if not self._finished:
                # The thread drops the resource when its wait returns. Under
                # our lock, so that the drop cannot race the interruption.
                if self._interrupt is not None:
                    self._interrupt(resource)
                return
            self._resource = None
            self._won = False
        self._drop(resource)
