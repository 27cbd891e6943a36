"""A worker's side of the run ledger: record a slot started, keep it alive, record its end.

The first delivery wins the set-if-absent of the slot's record and runs; later ones do
not. One thread per process renews the liveness of every running slot, so a record
whose liveness has passed belongs to a dead worker: ``leader_on_redelivery`` says
whether a later delivery reruns it or records it skipped.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace

from ..exceptions import StoreUnavailable
from ..probes import metrics
from .crons import SentryCrons
from .overlap import EntryMarks
from .records import FAILURE, FINISHED, SENT, SKIPPED, STARTED, SUCCESS, RunRecord
from .target import LedgerTarget

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """Whether this delivery of ``slot`` runs; if not, why (for the log line)."""

    slot: str
    run: bool
    why: str = ""
    #: The metric the decision counts: ``ledger_duplicates``, ``ledger_skips`` ...
    counter: str | None = None


class RunGuard:
    """Run-ledger writes of one worker process for one store and election."""

    def __init__(self, target: LedgerTarget, on_redelivery: str) -> None:
        self.target = target
        self.on_redelivery = on_redelivery
        self._lock = threading.Lock()
        #: Slots running in this process: slot -> (stored text, record).
        self._running: dict[str, tuple[str, RunRecord]] = {}
        self._renewer: threading.Thread | None = None
        self._renewer_pid = 0
        self._wake = threading.Event()
        #: Serializes a running slot's writes (renewals, its end): each is a
        #: compare-and-set on the text the one before it wrote.
        self._writing = threading.Lock()
        #: The overlap marks of the slots running here.
        self.marks = EntryMarks(target)
        #: Sentry Crons check-ins of the slots that run here (``leader_sentry_crons``).
        self.crons: SentryCrons | None = None

    def begin(
        self,
        slot: str,
        retry: bool = False,
        overlap: str = "allow",
        overlap_wait: float = 0.0,
        epoch: int | None = None,
    ) -> Decision:
        """Record ``slot`` started here, unless a delivery of it started or ended already.

        ``retry``: a retry the task asked for, which takes a started record over.
        ``overlap``: ``"skip"`` or ``"wait"`` while another slot of the entry runs (a slot
        skipped for it is recorded ``skipped``). ``epoch``: the leader's term the message
        was sent under (its ``leader_epoch``), kept in the record. Raises
        :class:`StoreUnavailable` when the store cannot say: the caller then runs the body
        (a lost store must not lose the slot).
        """
        decision = self._decide(slot, retry, overlap, overlap_wait, epoch)
        if decision.run and self.crons is not None:
            self.crons.started(slot, slot.rpartition("@")[0])
        return decision

    def _decide(
        self, slot: str, retry: bool, overlap: str, overlap_wait: float, epoch: int | None
    ) -> Decision:
        decision = self._begin(slot, retry, epoch)
        if not decision.run or overlap == "allow":
            return decision
        entry = slot.rpartition("@")[0]
        try:
            holder = self.marks.take(entry, slot, overlap, overlap_wait)
        except StoreUnavailable as exc:
            # The slot is recorded started: it runs, unguarded, rather than being lost.
            logger.warning("celery-leader: slot %s runs without its overlap check: %s", slot, exc)
            return decision
        if holder is None:
            return decision
        why = f"slot {holder} of {entry!r} is still running (overlap {overlap!r})"
        self.finish(slot, SKIPPED, why)
        return Decision(slot, False, why, "ledger_overlap_skips")

    def _begin(self, slot: str, retry: bool, epoch: int | None) -> Decision:
        mine = self._started(slot, 1, epoch)
        won, stored = self._put(slot, None, mine)
        waited = False
        for _ in range(4):  # a record that changes under us is judged again
            if won:
                return self._running_now(slot, mine)
            if stored is None:
                won, stored = self._put(slot, None, mine)
                continue
            record = RunRecord.load(stored, slot)
            if record is None:
                return Decision(slot, False, "its record is not one celery-leader wrote")
            if record.status == FINISHED:
                why = f"it ran already ({record.outcome} on {record.worker})"
                return Decision(slot, False, why, "ledger_duplicates")
            if record.status == SENT:
                # Beat's mark that it published the slot: nobody started it yet.
                if mine.epoch is None:
                    mine = replace(mine, epoch=record.epoch)
                won, stored = self._put(slot, stored, mine)
                continue
            if record.status != STARTED:
                return Decision(slot, False, f"its record says {record.status!r}")
            now = self.target.clock()
            if record.alive(now) and not retry:
                if self.on_redelivery == "skip" or waited:
                    why = f"it is running on {record.worker} (pid {record.pid})"
                    return Decision(slot, False, why, "ledger_duplicates")
                # A redelivery may come before the liveness of the worker that
                # died lapses: wait that out once (at most one ttl), then look again.
                waited = True
                time.sleep(max(0.0, record.alive_until - now) + 0.05)
                won, stored = self._put(slot, stored, record)  # unchanged: same text
                won = False
                continue
            mine = self._started(slot, record.attempt + 1, record.epoch if epoch is None else epoch)
            if retry:
                won, stored = self._put(slot, stored, mine)
                continue
            # Started by a worker whose liveness lapsed: it died mid-run.
            if self.on_redelivery == "rerun":
                won, stored = self._put(slot, stored, mine)
                if won:
                    msg = "celery-leader: slot %s runs again (attempt %d): %s died running it"
                    logger.info(msg, slot, mine.attempt, record.worker)
                    return replace(self._running_now(slot, mine), counter="ledger_reruns")
                continue
            skipped = record.ended(now, SKIPPED, f"{record.worker} died mid-run")
            won, stored = self._put(slot, stored, skipped)
            if won:
                why = f"{record.worker} died running it and leader_on_redelivery is 'skip'"
                return Decision(slot, False, why, "ledger_skips")
        return Decision(slot, False, "its record kept changing", "ledger_duplicates")

    def finish(self, slot: str, outcome: str, reason: str | None = None) -> None:
        """Record how ``slot``'s body ended here (``success``, ``failure``, ``skipped``)."""
        self.marks.release(slot)
        with self._writing:
            running = self._stop(slot)
            if running is None:
                return
            if outcome in (SUCCESS, FAILURE):
                metrics.count("ledger_finished", self.target.election)
            stored, record = running
            ended = record.ended(self.target.clock(), outcome, reason)
            if self.crons is not None:
                duration = max(0.0, (ended.finished or record.started) - record.started)
                self.crons.ended(slot, record.entry, outcome, duration)
            try:
                won, now = self._put(slot, stored, ended)
            except StoreUnavailable as exc:
                logger.warning("celery-leader: slot %s: its end was not recorded: %s", slot, exc)
                return
        if not won:
            msg = (
                "celery-leader: slot %s ended here (%s), but its record had changed (its "
                "liveness lapsed and another delivery took it over): %s"
            )
            logger.warning(msg, slot, outcome, now)

    def release(self, slot: str) -> None:
        """Stop renewing ``slot`` and leave its record started (a retry takes it over)."""
        self.marks.release(slot)
        self._stop(slot)

    def _running_now(self, slot: str, record: RunRecord) -> Decision:
        with self._lock:
            self._running[slot] = (record.dump(), record)
            self._start_renewer()
        metrics.adjust("ledger_running", self.target.election, 1)
        return Decision(slot, True, counter="ledger_runs")

    def _stop(self, slot: str) -> tuple[str, RunRecord] | None:
        """Forget ``slot`` as running here; what it held, if it was."""
        with self._lock:
            running = self._running.pop(slot, None)
        if running is not None:
            metrics.adjust("ledger_running", self.target.election, -1)
        return running

    def _started(self, slot: str, attempt: int, epoch: int | None) -> RunRecord:
        now = self.target.clock()
        return RunRecord(
            slot, STARTED, self.target.instance_id, os.getpid(), now, now + self.target.ttl,
            attempt, epoch=epoch,
        )  # fmt: skip

    def _put(self, slot: str, expected: str | None, record: RunRecord) -> tuple[bool, str | None]:
        return self.target.put(slot, expected, record.dump(), record.tally)

    def _start_renewer(self) -> None:
        # A forked pool child inherits the object but not the thread.
        if self._renewer is not None and self._renewer_pid == os.getpid():
            return
        self._renewer_pid = os.getpid()
        self._renewer = threading.Thread(
            target=self._renew_loop, name="celery-leader ledger", daemon=True
        )
        self._renewer.start()

    def _renew_loop(self) -> None:
        while True:
            self._wake.wait(self.target.renew_interval)
            with self._lock:
                slots = list(self._running)
            for slot in slots:
                self._renew(slot)
                self.marks.renew(slot)

    def _renew(self, slot: str) -> None:
        with self._writing:
            with self._lock:
                running = self._running.get(slot)
            if running is None:
                return  # finished meanwhile
            stored, record = running
            renewed = replace(record, alive_until=self.target.clock() + self.target.ttl)
            try:
                won, _ = self._put(slot, stored, renewed)
            except StoreUnavailable as exc:
                logger.warning("celery-leader: slot %s: liveness not renewed: %s", slot, exc)
                return
            self._renewed(slot, renewed, won)

    def _renewed(self, slot: str, renewed: RunRecord, won: bool) -> None:
        with self._lock:
            if won:
                self._running[slot] = (renewed.dump(), renewed)
            else:
                logger.warning(
                    "celery-leader: slot %s: its record changed while it ran here "
                    "(its liveness lapsed and another delivery took it over)",
                    slot,
                )
        if not won:
            self._stop(slot)
