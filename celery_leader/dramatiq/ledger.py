"""Dramatiq workers run each scheduler-sent slot once: the run ledger's middleware step.

Before a message with ``leader_slot`` runs, its slot is recorded started; a second
delivery is skipped (``SkipMessage``: acked, never run). A failure ``Retries`` will
retry leaves the slot started for the retry. Other messages pay one dict lookup.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from dramatiq.middleware import Middleware, SkipMessage

from ..ledger import RunGuard, crons, step
from ..ledger.records import SUCCESS
from ..settings.config import LeaderConfig


class LedgerStep(Middleware):
    """The run-ledger hooks of one middleware, for every process it runs in."""

    def __init__(self, config: LeaderConfig) -> None:
        if config.sentry_crons:
            crons.require()  # fails as the middleware is built, not at the first slot
        self.config = config
        self._guards: dict[int, RunGuard] = {}  # by pid: forked processes build their own
        self._registered: set[int] = set()
        self._lock = threading.Lock()

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        """Keep the ``@ledger-workers`` mark alive from this process."""
        self._guard()

    def before_process_message(self, broker: Any, message: Any) -> None:
        """Record the message's slot started, or skip a second delivery of it."""
        # A retry's message carries its options over: the flag is this attempt's alone.
        message.options.pop("leader_ledger_runs", None)
        slot = message.options.get("leader_slot")
        if not isinstance(slot, str) or not slot:
            return
        guard = self._guard()
        overlap = message.options.get("leader_overlap")
        retry = bool(message.options.get("retries"))
        epoch = message.options.get("leader_epoch")
        decision = step.begin(guard, self.config, slot, retry, overlap, epoch)
        if decision is None:
            return  # unrecorded beats unrun
        if not decision.run:
            raise SkipMessage(f"slot {slot} not run: {decision.why}")
        message.options["leader_ledger_runs"] = True

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
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

    def after_skip_message(self, broker: Any, message: Any) -> None:
        """Another part skipped a slot this one recorded started: leave it to a retry."""
        self.after_process_message(broker, message, exception=SkipMessage())

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
