"""Claim a batch of due slots, publish what was claimed, account for what failed.

Only a claimed slot is published, so a cut-off ex-leader publishes nothing. A
publish that failed before reaching the broker is *handed back* (the state set back
to the last slot sent, so a leader sends it); one of unknown outcome stays claimed,
never sent twice. After ``leader_max_publish_failures`` in a row the leader resigns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from ..backends import Fence, FencedRecords
from ..election.lease import Lease
from ..exceptions import StoreUnavailable
from ..probes import metrics
from .jobs import Adapter, Job, Outcome
from .resend import Resender
from .state import Claim, dump_state, slot_name
from .sync import EntryState

#: Slots whose publishes an adapter may buffer before they are flushed in one
#: round trip to the broker. A flush of unknown outcome leaves all of them
#: claimed and maybe unsent, so this bounds what such a failure costs.
PIPELINE = 100


@dataclass
class Batch:
    """The slots one due entry sends in this tick, and the claim that records them."""

    job: Job
    slots: list[str]  # to send, oldest first
    dues: list[datetime]  # their due instants (UTC)
    before: EntryState  # the state before the claim
    after: EntryState  # the state the claim writes
    claim: Claim
    dropped: int = 0  # missed slots the claim records as not sent (the policy)
    sent: list[str] = field(default_factory=list)


class Publisher:
    """Claims batches, publishes them through the adapter, and keeps the failure count."""

    def __init__(
        self,
        lease: Lease,
        records: FencedRecords,
        adapter: Adapter,
        max_failures: int,
        logger: logging.Logger,
        resender: Resender | None = None,
    ) -> None:
        self.lease = lease
        self.records = records
        #: With the run ledger on: marks sent slots, re-sends unknown outcomes.
        self.resender = resender
        self.adapter = adapter
        self.max_failures = max_failures
        self.logger = logger
        self.failures = 0  # failed publishes in a row
        self._refused: set[str] = set()  # entries whose refused slot was logged

    def run(self, batches: list[Batch], fence: Fence, states: dict[str, EntryState]) -> bool:
        """Claim and publish ``batches``, updating ``states`` with what the store now records;
        False when the local state went stale."""
        lease = self.lease
        try:
            with lease.observe("claim"):
                won = self.records.claim(fence, [b.claim.write() for b in batches])
        except StoreUnavailable as exc:
            self.logger.warning("celery-leader: claims failed, nothing sent: %s", exc)
            return False
        in_sync = True
        claimed = []
        for batch, ok in zip(batches, won, strict=True):
            if not ok and not batch.claim.admissible():
                self._refuse(batch)
                continue
            if not ok:
                in_sync = False
                what = ", ".join(batch.slots) or f"the state of {batch.job.name!r}"
                self.logger.warning("celery-leader: slot %s not claimed; not sending it", what)
                metrics.count("claims_lost", lease.election)
                continue
            states[batch.job.name] = batch.after
            if batch.dropped:
                self._dropped(batch)
            self.adapter.recorded(
                batch.job, batch.after.last_run_at, batch.after.count, bool(batch.slots)
            )
            claimed.append(batch)
        with self.adapter.publishing():
            failure = self._send_all(claimed, fence.term.epoch)
        if failure is not None:
            in_sync &= self._failed(claimed, failure, fence, states)
        return in_sync

    def _dropped(self, batch: Batch) -> None:
        """Report the missed slots a won claim recorded as not sent (a lost claim records
        nothing: the next leader drops and reports them)."""
        job = batch.job
        msg = (
            "celery-leader: not sending %d missed slot(s) of %r, the last due %s "
            "(leader_missed_slots %s%s)"
        )
        due = slot_name(job.name, batch.after.last_run_at, job.zone).partition("@")[2]
        grace = "" if job.grace is None else f", grace {job.grace:g} s"
        self.logger.info(msg, batch.dropped, job.name, due, job.missed_slots, grace)
        metrics.count("missed_slots_dropped", self.lease.election, batch.dropped)

    def _refuse(self, batch: Batch) -> None:
        """A slot not after the entry's last one: never sent; logged once per entry."""
        name = batch.job.name
        metrics.count("claims_lost", self.lease.election)
        if name in self._refused:
            return
        self._refused.add(name)
        msg = (
            "celery-leader: refused slot(s) %s of %r: not after its last slot (%s); the "
            "schedule's due times went backwards, and nothing is sent twice"
        )
        self.logger.error(msg, ", ".join(batch.slots), name, batch.before.last_run_at.isoformat())

    def _send_all(self, batches: list[Batch], epoch: int) -> tuple[str, Outcome] | None:
        """Publish every claimed slot (flushed every :data:`PIPELINE` slots, before a failure
        is dealt with and at the end); stop at the first failure: ``(slot, outcome)``."""
        pending: list[tuple[Batch, str, datetime]] = []  # buffered, not yet flushed
        for batch in batches:
            for slot, due in zip(batch.slots, batch.dues, strict=True):
                self.logger.info("celery-leader: sending slot %s (epoch %d)", slot, epoch)
                outcome = self.adapter.send(batch.job, slot, due, epoch)
                if outcome.error is None:
                    batch.sent.append(slot)
                    pending.append((batch, slot, due))
                    if len(pending) >= PIPELINE:
                        failure = self._flush(pending, epoch)
                        if failure is not None:
                            return failure
                    continue
                # What was buffered before this slot still goes out first.
                keep = None if outcome.definitely_unsent else batch
                failure = self._flush(pending, epoch, keep)
                if not outcome.definitely_unsent:
                    batch.sent.append(slot)  # it may be in the broker: it stays claimed
                    if self.resender is not None:
                        self.resender.unknown(batch.job, slot, due)
                return failure or (slot, outcome)
        return self._flush(pending, epoch)

    def _flush(
        self, pending: list[tuple[Batch, str, datetime]], epoch: int, keep: Batch | None = None
    ) -> tuple[str, Outcome] | None:
        """Deliver the buffered ``pending`` slots of ``epoch`` (emptied); the failure, if any. Slots
        definitely not delivered leave their batches' ``sent`` and are handed back, except
        those of ``keep``, whose later slot stays claimed."""
        if not pending:
            return None
        outcome = self.adapter.flush()
        flushed, pending[:] = list(pending), []
        if outcome.error is None:
            self.failures = 0
            metrics.count("slots_sent", self.lease.election, len(flushed))
            if self.resender is not None:
                for batch, slot, due in flushed:
                    self.resender.sent(batch.job, slot, due, epoch)
            return None
        for batch, slot, due in reversed(flushed):
            if outcome.definitely_unsent and batch is not keep:
                batch.sent.pop()
            elif self.resender is not None:
                self.resender.unknown(batch.job, slot, due)
        return flushed[0][1], outcome

    def _failed(
        self,
        batches: list[Batch],
        failure: tuple[str, Outcome],
        fence: Fence,
        states: dict[str, EntryState],
    ) -> bool:
        """Hand back what was claimed and not sent; resign after too many failures in a row.
        False when the local state no longer matches the store."""
        lease = self.lease
        slot, outcome = failure
        self.failures += 1
        metrics.count("publish_failures", lease.election)
        if outcome.definitely_unsent:
            msg = "celery-leader: could not send slot %s: nothing reached the broker (%s)"
            self.logger.warning(msg, slot, outcome.error)
        elif self.resender is not None:
            msg = (
                "celery-leader: could not send slot %s and the broker may have it (%s): "
                "it is re-sent once if workers deduplicate (run ledger)"
            )
            self.logger.warning(msg, slot, outcome.error)
        else:
            msg = (
                "celery-leader: could not send slot %s and the broker may have it (%s): "
                "it stays claimed and is not sent again"
            )
            self.logger.error(msg, slot, outcome.error)
        in_sync = self._hand_back(batches, fence, states)
        if self.failures >= self.max_failures:
            msg = (
                "celery-leader: %d publishes failed in a row (the last: slot %s): resigning "
                "the lead of %r for %g s so that a replica that reaches the broker takes over"
            )
            self.logger.warning(msg, self.failures, slot, lease.election, lease.ttl)
            lease.step_down(
                f"{self.failures} publishes failed in a row",
                kind="publish_failures",
                sit_out=lease.ttl,
            )
            self.failures = 0
        return in_sync

    def _hand_back(self, batches: list[Batch], fence: Fence, states: dict[str, EntryState]) -> bool:
        """Undo the claims of unsent slots in one fenced compare-and-set: the stored state goes
        back to the last slot sent, so the next leader (or this one) sends the rest. False when
        that failed."""
        lease = self.lease
        by = (fence.term.epoch, lease.instance_id)
        backs: list[tuple[Batch, list[str], EntryState, Claim]] = []
        for batch in batches:
            unsent = batch.slots[len(batch.sent) :]
            if not unsent:
                continue
            last_run_at = batch.before.last_run_at
            if batch.sent:
                last_run_at = batch.dues[len(batch.sent) - 1]
            count = batch.before.count + len(batch.sent)
            kept = (batch.after.generation, batch.after.active_since)
            slot = batch.sent[-1] if batch.sent else None
            raw = dump_state(last_run_at, count, *by, slot, *kept)
            claim = Claim(batch.job.name, batch.after.raw, raw)
            state = EntryState.write(last_run_at, count, by, slot, *kept)
            backs.append((batch, unsent, state, claim))
        if not backs:
            return True
        won = [False] * len(backs)
        reason = "the term ended"
        try:
            with lease.observe("claim"):
                won = self.records.claim(fence, [b[3].write() for b in backs])
        except StoreUnavailable as exc:
            reason = str(exc)
        for (batch, unsent, state, _), ok in zip(backs, won, strict=True):
            if ok:
                states[batch.job.name] = state
                self.adapter.recorded(batch.job, state.last_run_at, state.count, False)
                self.logger.warning(
                    "celery-leader: handed back unsent slot(s) %s: the next leader sends them",
                    ", ".join(unsent),
                )
                metrics.count("slots_handed_back", lease.election, len(unsent))
            else:
                msg = (
                    "celery-leader: slot(s) %s lost: claimed, not sent, and handing them back "
                    "failed (%s)"
                )
                self.logger.error(msg, ", ".join(unsent), reason)
                metrics.count("slots_lost", lease.election, len(unsent))
        return all(won)
