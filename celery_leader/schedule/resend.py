"""Beat sends at least once: re-send what may not have reached the broker.

With ``leader_ledger`` on (:mod:`celery_leader.ledger`), a slot published without
error is marked ``sent``; one of unknown outcome is re-sent once at the next tick;
and a new term re-sends once each entry's last claimed slot that left no ledger
record. "Once" is a set-if-absent of the ``sent`` mark before the re-send. Only
while a worker with the dedup step is registered (``@ledger-workers``), and only
slots claimed after the ledger was turned on (``@ledger-since``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from ..backends import RunStore
from ..election.lease import Lease
from ..exceptions import StoreUnavailable
from ..ledger import marks
from ..ledger.records import SINCE, WORKERS
from ..probes import metrics
from .jobs import Adapter, Job
from .state import slot_name
from .sync import EntryState


@dataclass(frozen=True)
class Pending:
    """A slot whose publish had an unknown outcome: re-sent at the next tick."""

    job: Job
    slot: str
    due: datetime


class Resender:
    """Beat's side of the run ledger, for one scheduler's lease."""

    def __init__(
        self,
        lease: Lease,
        runs: RunStore,
        adapter: Adapter,
        retention: float,
        keep: int,
        logger: logging.Logger,
    ) -> None:
        self.lease = lease
        self.runs = runs
        self.adapter = adapter
        self.retention = retention
        self.keep = keep
        self.logger = logger
        self._pending: list[Pending] = []
        #: Whether dedup workers were registered, and until when (lease's monotonic
        #: clock) that answer is reused: ``sent`` asks at most once per ttl.
        self._dedup = False
        self._dedup_until = 0.0

    def sent(self, slot: str, epoch: int) -> None:
        """``slot`` is in the broker, sent under ``epoch``: mark it sent, only while dedup
        workers are registered (one sent unmarked just before they registered is at worst
        re-sent once)."""
        try:
            if self._workers_registered():
                self._mark_sent(slot, epoch)
        except StoreUnavailable as exc:
            # Without the mark a later leader may re-send it once; workers drop the copy.
            self.logger.info("celery-leader: slot %s sent, not marked sent: %s", slot, exc)

    def unknown(self, job: Job, slot: str, due: datetime) -> None:
        """``slot``'s publish may or may not have reached the broker: re-send it next tick."""
        self._pending.append(Pending(job, slot, due))

    def retry(self, epoch: int) -> None:
        """Re-send, once, the slots whose publish had an unknown outcome; only while workers
        deduplicate (else they stay claimed and unsent, as with the ledger off)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            dedup = self._workers_deduplicate()
        except StoreUnavailable as exc:
            self.logger.warning("celery-leader: slot(s) %s not re-sent: %s", _names(pending), exc)
            return
        if not dedup:
            self.logger.warning(
                "celery-leader: slot(s) %s not re-sent: no worker with the run ledger's "
                "dedup step has registered, so a second copy could run twice",
                _names(pending),
            )
            return
        for p in pending:
            self._resend(p.job, p.slot, p.due, epoch, "its publish had an unknown outcome")

    def recover(self, jobs: list[Job], states: Mapping[str, EntryState], epoch: int) -> None:
        """A new term: re-send, once, each entry's last slot claimed before the term (as
        ``states`` has it) that left no trace."""
        try:
            since = self._since()
            if not self._workers_deduplicate():
                self.logger.info(
                    "celery-leader: run ledger on, but no worker with its dedup step has "
                    "registered: nothing is re-sent (at most once, as with the ledger off)"
                )
                return
            for job in jobs:
                state = states.get(job.name)
                slot = None if state is None else _last_slot(state)
                # Older than half the retention: its record may have expired, so
                # no record says nothing; not re-sent.
                oldest = max(since, datetime.now(timezone.utc).timestamp() - self.retention / 2)
                if state is None or slot is None or state.last_run_at.timestamp() < oldest:
                    continue
                if slot != slot_name(job.name, state.last_run_at, job.zone):
                    continue  # the state names a slot of another zone or form: leave it
                if marks.read(self.runs, self.lease.election, slot, self.retention) is None:
                    why = "it was claimed by a leader that may not have sent it"
                    self._resend(job, slot, state.last_run_at, epoch, why)
        except StoreUnavailable as exc:
            self.logger.warning("celery-leader: could not look for slots to re-send: %s", exc)

    def _since(self) -> float:
        now = datetime.now(timezone.utc).timestamp()
        stored = marks.touch(self.runs, self.lease.election, SINCE, {"since": now}, self.retention)
        try:
            return float(json.loads(stored)["since"])
        except (ValueError, KeyError, TypeError):
            return now

    def _workers_deduplicate(self) -> bool:
        """Whether a worker with the dedup step keeps the ``@ledger-workers`` mark (one read)."""
        found = marks.read(self.runs, self.lease.election, WORKERS, self.retention) is not None
        self._dedup, self._dedup_until = found, self.lease.clock.monotonic() + self.lease.ttl
        return found

    def _mark_sent(self, slot: str, epoch: int) -> bool:
        args = (self.lease.instance_id, self.retention, self.keep, epoch)
        return marks.mark_sent(self.runs, self.lease.election, slot, *args)

    def _workers_registered(self) -> bool:
        """:meth:`_workers_deduplicate`, read again at most once per ttl."""
        if self.lease.clock.monotonic() < self._dedup_until:
            return self._dedup
        return self._workers_deduplicate()

    def _resend(self, job: Job, slot: str, due: datetime, epoch: int, why: str) -> None:
        try:
            won = self._mark_sent(slot, epoch)
        except StoreUnavailable as exc:
            self.logger.warning("celery-leader: slot %s not re-sent: %s", slot, exc)
            return
        if not won:
            return  # a worker recorded it, or another leader re-sent it
        self.logger.warning("celery-leader: re-sending slot %s (epoch %d): %s", slot, epoch, why)
        metrics.count("ledger_resends", self.lease.election)
        outcome = self.adapter.send(job, slot, due, epoch)
        if outcome.error is not None:
            msg = "celery-leader: re-sending slot %s failed (%s); it is not re-sent again"
            self.logger.error(msg, slot, outcome.error)


def _names(pending: list[Pending]) -> str:
    return ", ".join(p.slot for p in pending)


def _last_slot(state: EntryState) -> str | None:
    """The slot the entry's stored state names as its last one, if any."""
    return state.slot
