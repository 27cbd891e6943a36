"""Dramatiq workers run each scheduler-sent slot once: the run ledger's middleware step.

:class:`~celery_leader.dramatiq.LeaderMiddleware` calls these hooks when
``CELERY_LEADER_LEDGER`` (or ``leader_ledger``) is on: before a message with
the ``leader_slot`` option runs, its slot is recorded started
(:meth:`~celery_leader.ledger.RunGuard.begin`); a delivery of a slot that
started or finished already is skipped (``SkipMessage``: acknowledged, never
run). After the actor, the outcome is recorded; a failure that the
``Retries`` middleware will retry leaves the slot started for the retry to
take over. Messages without ``leader_slot`` pay one dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ..config import LeaderConfig
from ..exceptions import missing_extra
from ..ledger import RunGuard, crons, step
from ..ledger.records import SUCCESS

try:
    from dramatiq.middleware import SkipMessage
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "dramatiq") from None

logger = logging.getLogger(__name__)


class LedgerStep:
    """The run-ledger hooks of one middleware, for every process it runs in."""

    def __init__(self, config: LeaderConfig) -> None:
        if config.sentry_crons:
            crons.require()  # fails as the middleware is built, not at the first slot
        self.config = config
        self._guards: dict[int, RunGuard] = {}  # by pid: forked processes build their own
        self._registered: set[int] = set()
        self._lock = threading.Lock()

    def before(self, message: Any) -> None:
        """Record the message's slot started, or skip a second delivery of it."""
        # A retry's message carries its options over: the flag is this attempt's alone.
        message.options.pop("leader_ledger_runs", None)
        slot = message.options.get("leader_slot")
        if not isinstance(slot, str) or not slot:
            return
        guard = self._guard()
        overlap = message.options.get("leader_overlap")
        retry = bool(message.options.get("retries"))
        decision = step.begin(guard, self.config, slot, retry, overlap)
        if decision is None:
            return  # unrecorded beats unrun
        if not decision.run:
            raise SkipMessage(f"slot {slot} not run: {decision.why}")
        message.options["leader_ledger_runs"] = True

    def after(self, message: Any, exception: BaseException | None) -> None:
        """Record how the slot's actor ended (a failure to be retried is left started)."""
        slot = message.options.get("leader_slot")
        if not message.options.pop("leader_ledger_runs", False) or not isinstance(slot, str):
            return
        guard = self._guard()
        if exception is None:
            guard.finish(slot, SUCCESS)
        elif getattr(message, "failed", False):
            step.failed(guard, slot)
        else:
            guard.release(slot)  # Retries enqueued it again: the retry takes it over

    def _guard(self) -> RunGuard:
        pid = os.getpid()
        with self._lock:
            guard = self._guards.get(pid)
            if guard is None:
                guard = self._guards[pid] = step.build_guard(self.config)
            if pid not in self._registered:
                self._registered.add(pid)
                step.register(self.config, self.config.instance_id)
            return guard

    def register(self) -> None:
        """Keep the ``@ledger-workers`` mark alive from this process (a worker boot)."""
        self._guard()
