"""Beat sends at least once: re-send what may not have reached a worker.

With ``leader_ledger`` on (:mod:`celery_leader.ledger`), a slot published without
error is marked ``sent``; one of unknown outcome is re-sent once at the next tick;
a new term re-sends once each entry's last claimed slot that left no ledger
record; and a slot no worker started (the broker lost it, or holds it for a dead
worker) is re-sent once when :mod:`~celery_leader.schedule.start_watch` says so.
"Once" is a set-if-absent, or a compare-and-set, of the ``sent`` mark before the
re-send. Only while a worker with the dedup step is registered
(``@ledger-workers``), and only slots claimed after the ledger was turned on
(``@ledger-since``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from ..backends import RunStore, RunWrite
from ..election.lease import Lease
from ..exceptions import StoreUnavailable
from ..ledger import marks
from ..ledger.records import SINCE, WORKERS
from ..probes import metrics
from .jobs import Adapter, Job
from .start_watch import MISSED, StartWatch, Verdict
from .state import slot_name
from .sync import EntryState

#: Longest a tick spends reading records and re-sending (seconds); the rest waits
#: for the next tick, so that a burst's re-sends never delay what falls due.
WATCH_BUDGET = 0.2


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
        resend_after: float,
    ) -> None:
        self.lease = lease
        self.runs = runs
        self.adapter = adapter
        self.retention = retention
        self.keep = keep
        self.logger = logger
        self._pending: list[Pending] = []
        #: The slots marked sent whose start is looked for (``None``:
        #: ``leader_ledger_resend_after`` is 0, never).
        self.watch = StartWatch(resend_after) if resend_after > 0 else None
        #: Whether dedup workers were registered, and until when (lease's monotonic
        #: clock) that answer is reused: ``sent`` asks at most once per ttl.
        self._dedup = False
        self._dedup_until = 0.0

    def sent(self, job: Job, slot: str, due: datetime, epoch: int) -> None:
        """``slot`` of ``job`` is in the broker, sent under ``epoch``: mark it sent, only
        while dedup workers are registered (one sent unmarked just before they registered
        is at worst re-sent once), and watch for its start."""
        try:
            if self._workers_registered():
                marked = self._mark_sent(slot, epoch)
                if self.watch is not None:
                    self.watch.sent(job, slot, due, self.lease.clock.monotonic(), marked)
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

    def unstarted(self, jobs: Mapping[str, Job], epoch: int) -> None:
        """Judge the watched slots of the entries due a read (see
        :mod:`~celery_leader.schedule.start_watch`) and re-send, once, those still not
        started that a later slot overtook under ``leader_missed_slots = "all"``, or whose
        ``leader_ledger_resend_after`` passed, as their entry's job is now (``jobs``, by
        name). A tick spends at most :data:`WATCH_BUDGET` seconds here."""
        watch = self.watch
        if watch is None:
            return
        now = self.lease.clock.monotonic()
        entries = watch.due_reads(now)
        ends = time.monotonic() + WATCH_BUDGET
        for done, entry in enumerate(entries):
            if time.monotonic() > ends:
                watch.unread(entries[done:])
                return
            try:
                read = self.runs.runs_of(self.lease.election, entry, watch.limit(entry))
            except StoreUnavailable as exc:
                msg = "celery-leader: could not look for sent slots no worker started: %s"
                self.logger.warning(msg, exc)
                watch.unread(entries[done:])
                return
            for verdict in watch.judge(entry, read, now):
                try:
                    self._resend_unstarted(verdict, jobs, now, epoch)
                except StoreUnavailable as exc:
                    # The take-over may have been written: it is not tried again.
                    msg = "celery-leader: slot %s was not started, and is not re-sent: %s"
                    self.logger.warning(msg, verdict.watched.slot, exc)

    def _resend_unstarted(
        self, verdict: Verdict, jobs: Mapping[str, Job], now: float, epoch: int
    ) -> None:
        """Re-send the slot of ``verdict`` if its entry and policy still want it, taking its
        ``sent`` mark over first (a worker that starts it meanwhile wins, and it is not
        re-sent)."""
        watched, slot = verdict.watched, verdict.watched.slot
        age = now - watched.at
        job = jobs.get(watched.job.name)
        why = None
        if job is None or job.generation != watched.job.generation:
            why = "its entry is gone, paused or made anew"
        elif job.active_since is not None and job.active_since > watched.due:
            why = "its entry was paused or rescheduled since"
        elif self.adapter.expired(job, age):
            why = "its message expired"
        if job is None or why is not None:
            self.logger.info("celery-leader: slot %s was not started; not re-sent: %s", slot, why)
            return
        if verdict.why == MISSED:
            overtaken = f"slot {verdict.later} of its entry, sent after it, has started"
            behind = (datetime.now(timezone.utc) - watched.due).total_seconds()
            rule = None
            if job.missed_slots != "all":
                rule = f"leader_missed_slots = {job.missed_slots!r}"
            elif job.grace is not None and behind > job.grace:
                rule = f"older than leader_missed_slots_grace ({job.grace:g} s)"
            if rule is not None:
                # INFO: a busy worker's prefetch holds a slot the same way, and runs it later.
                self.logger.info(
                    "celery-leader: not sending slot %s again: it has not started, and %s "
                    "(its message lost by the broker, or held by a busy worker); a missed "
                    "slot, %s",
                    slot,
                    overtaken,
                    rule,
                )
                return
        else:
            overtaken = f"no worker started it in the {age:.0f} s since its publish"
        again = replace(verdict.record, started=time.time(), epoch=epoch)
        write = RunWrite(slot, verdict.stored, again.dump(), self.retention, 0, again.tally)
        if not self.runs.put(self.lease.election, write)[0]:
            return  # a worker started it just now
        why = f"{overtaken} (a message the broker lost, or holds for a dead worker)"
        self._send_again(job, slot, watched.due, epoch, why)

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
        self._send_again(job, slot, due, epoch, why)

    def _send_again(self, job: Job, slot: str, due: datetime, epoch: int, why: str) -> None:
        """Publish ``slot`` again, its ``sent`` mark already taken: once, whatever happens."""
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
