"""The leader's side of run now: each request becomes a slot of its entry, once.

At each tick the leader looks at the run requests its entries feed holds
(:mod:`~celery_leader.schedule.run_request`; none is the idle case, and costs
nothing), and for each one not yet answered:

1. drops it if it is older than :data:`~.run_request.REQUEST_TTL` (``expired``),
   or refuses it when the adapter cannot send its entry (``refused``: no such
   entry, outside ``leader_entries_allow``, an option the framework refuses);
2. **claims** the rest in one fenced round trip under its term: the record
   ``@run-now`` among the election's fenced records names every request
   claimed, with its slot and epoch. A leader whose term ended claims nothing,
   and a request claimed once is never sent again by anyone;
3. publishes each claimed one through the adapter, as a scheduled slot is: the
   entry's options (Celery's ``overlap`` as the ``leader_overlap`` header), the
   ``leader_epoch`` and ``leader_slot`` headers, the run ledger's ``sent`` mark;
4. writes the outcome into each request, for its requester.

A request a previous leader claimed but did not answer (it stopped between its
claim and its answer) is answered ``unknown``; with the run ledger it is
re-sent once, as a grid slot would be, unless a worker recorded it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from ..backends import Edit, EntryStore, Fence, FencedRecords, Write
from ..election.lease import Lease
from ..exceptions import StoreUnavailable
from ..probes import metrics
from .jobs import Adapter, Job
from .resend import Resender
from .run_request import (
    EXPIRED,
    FAILED,
    OUTCOME_KEEP,
    REFUSED,
    REQUEST_TTL,
    SENT,
    UNKNOWN,
    RunOutcome,
    RunRequest,
    run_slot,
    run_slot_time,
)

#: The fenced record of the run requests claimed, by request key: ``{"slot", "epoch"}``.
CLAIMS = "@run-now"


class RunDesk:
    """Sends the run requests of one term (see the module docstring)."""

    def __init__(
        self,
        lease: Lease,
        records: FencedRecords,
        entries: EntryStore,
        adapter: Adapter,
        logger: logging.Logger,
        resender: Resender | None,
    ) -> None:
        self.lease = lease
        self.records = records
        self.entries = entries
        self.adapter = adapter
        self.logger = logger
        self.resender = resender
        #: The claims record as stored and read (``None``: read it before claiming).
        self._claims: tuple[str | None, dict[str, Any]] | None = None
        #: Requests parsed, by key, with the text they were parsed from.
        self._parsed: dict[str, tuple[str, RunRequest | None]] = {}
        #: Requests answered by this desk, by key: the text answered, the answer, and
        #: whether the store has taken it. The feed may show the unanswered text for a
        #: poll interval more: it is not answered twice, and an answer the store could
        #: not take (unreachable) is written again at the next tick.
        self._answered: dict[str, tuple[str, str, bool]] = {}
        #: Requests removed (kept past their time), by key, with the text removed:
        #: the feed may show them a poll interval more.
        self._removed: dict[str, str] = {}

    def run(self, fence: Fence, now: datetime) -> None:
        """Deal with the requests the adapter's entries feed holds now."""
        texts = self.adapter.run_requests()
        if not texts and not self._answered and not self._removed:
            return
        try:
            self._run(texts, fence, now)
        except StoreUnavailable as exc:
            self.logger.warning("celery-leader: run-now requests not handled: %s", exc)

    def _run(self, texts: Mapping[str, str], fence: Fence, now: datetime) -> None:
        at = now.timestamp()
        for key in list(self._answered):
            if texts.get(key) != self._answered[key][0]:
                del self._answered[key]  # the feed shows the answer (or the request is gone)
        self._removed = {k: t for k, t in self._removed.items() if texts.get(k) == t}
        self._parsed = {k: self._parse(k, t) for k, t in texts.items()}
        pending: list[tuple[str, str, RunRequest]] = []
        spent: list[Edit] = []
        for key, (text, request) in self._parsed.items():
            if request is None or key in self._answered:
                continue
            if request.outcome is None:
                pending.append((key, text, request))
            elif at - request.outcome.at > OUTCOME_KEEP and key not in self._removed:
                spent.append(Edit(key, text, None))
        if pending:
            self._dispatch(pending, fence, now)
        unwritten = [
            Edit(key, text, answer)
            for key, (text, answer, written) in self._answered.items()
            if not written
        ]
        if unwritten or spent:
            # An answer the store did not take: the request changed under it, and
            # nobody else answers requests. Either way it is done.
            self.entries.edit(self.lease.election, unwritten + spent)
            for edit in unwritten:
                text, answer, _ = self._answered[edit.key]
                self._answered[edit.key] = (text, answer, True)
            self._removed.update((edit.key, edit.expected or "") for edit in spent)

    def _parse(self, key: str, text: str) -> tuple[str, RunRequest | None]:
        known = self._parsed.get(key)
        if known is not None and known[0] == text:
            return known
        request = RunRequest.load(text)
        if request is None:
            self.logger.error("celery-leader: skipping unreadable run-now request %s", key)
        return text, request

    def _dispatch(
        self, pending: list[tuple[str, str, RunRequest]], fence: Fence, now: datetime
    ) -> None:
        """Claim, send and answer ``pending`` (answers written by the caller)."""
        at, epoch = now.timestamp(), fence.term.epoch
        raw, claims = self._read_claims()
        outcomes: dict[str, RunOutcome] = {}
        sends: list[tuple[str, RunRequest, Job, str]] = []
        slots: set[str] = set()
        for key, _, request in pending:
            claimed = claims.get(key)
            if claimed is not None:
                outcomes[key] = self._unanswered(request, claimed, at)
                continue
            if at - request.requested_at > REQUEST_TTL:
                why = (
                    f"no leader took the request within {REQUEST_TTL:g} s of it; dropped, "
                    "not run late"
                )
                outcomes[key] = RunOutcome(EXPIRED, at, why=why)
                self.logger.warning(
                    "celery-leader: run-now request %s of %r dropped: %s",
                    request.key,
                    request.entry,
                    why,
                )
                continue
            job = self.adapter.run_job(request.entry)
            if isinstance(job, str):
                outcomes[key] = RunOutcome(REFUSED, at, why=job)
                self.logger.warning(
                    "celery-leader: run-now request %s of %r refused: %s",
                    request.key,
                    request.entry,
                    job,
                )
                continue
            # Two requests of one entry in one tick get slots a millisecond apart:
            # a slot name is what workers deduplicate on.
            due = now
            while (slot := run_slot(request.entry, due)) in slots:
                due += timedelta(milliseconds=1)
            slots.add(slot)
            sends.append((key, request, job, slot))
        if sends:
            live = {k: v for k, v in claims.items() if k in self._parsed}
            live.update((key, {"slot": slot, "epoch": epoch}) for key, _, _, slot in sends)
            new = json.dumps(live, sort_keys=True, separators=(",", ":"))
            with self.lease.observe("claim"):
                (won,) = self.records.claim(fence, [Write(CLAIMS, raw, new)])
            if not won:
                # Our term ended, or another leader claimed meanwhile: read again next tick.
                self._claims = None
                self.logger.warning(
                    "celery-leader: run-now request(s) %s not claimed; not sending them",
                    ", ".join(request.key for _, request, _, _ in sends),
                )
                sends = []
            else:
                self._claims = (new, live)
        for key, request, job, slot in sends:
            outcomes[key] = self._send(request, job, slot, now, epoch)
        for key, text, request in pending:
            outcome = outcomes.get(key)
            if outcome is not None:
                self._answered[key] = (text, request.answered(outcome).dump(), False)

    def _send(
        self, request: RunRequest, job: Job, slot: str, now: datetime, epoch: int
    ) -> RunOutcome:
        """Publish ``slot`` of ``job`` under ``epoch``; what became of it."""
        self.logger.info(
            "celery-leader: sending slot %s (epoch %d): run-now request %s by %s%s",
            slot,
            epoch,
            request.key,
            request.who,
            "" if request.why is None else f" ({request.why})",
        )
        outcome = self.adapter.send(job, slot, now, epoch)
        at = now.timestamp()
        if outcome.error is None:
            metrics.count("slots_sent", self.lease.election)
            if self.resender is not None:
                self.resender.sent(job, slot, now, epoch)
            return RunOutcome(SENT, at, slot, epoch)
        why = f"{type(outcome.error).__name__}: {outcome.error}"
        metrics.count("publish_failures", self.lease.election)
        if outcome.definitely_unsent:
            self.logger.warning(
                "celery-leader: could not send slot %s: nothing reached the broker (%s)", slot, why
            )
            return RunOutcome(FAILED, at, slot, epoch, f"nothing reached the broker: {why}")
        self.logger.warning(
            "celery-leader: could not send slot %s and the broker may have it (%s)", slot, why
        )
        if self.resender is not None:
            self.resender.unknown(job, slot, now)
        return RunOutcome(UNKNOWN, at, slot, epoch, f"the broker may have it: {why}")

    def _unanswered(self, request: RunRequest, claimed: Mapping[str, Any], at: float) -> RunOutcome:
        """The outcome of a request claimed (by a leader now gone) and never answered."""
        slot, epoch = str(claimed.get("slot")), claimed.get("epoch")
        why = (
            f"claimed by the leader of epoch {epoch}, which stopped before saying whether "
            "it sent it"
        )
        job = self.adapter.run_job(request.entry)
        due = run_slot_time(slot)
        if self.resender is not None and not isinstance(job, str) and due is not None:
            # Re-sent once at the next tick if workers deduplicate and none recorded it.
            self.resender.unknown(job, slot, due)
            why += "; the run ledger re-sends it once unless a worker recorded it"
        self.logger.warning("celery-leader: run-now slot %s: %s", slot, why)
        return RunOutcome(UNKNOWN, at, slot, None if epoch is None else int(epoch), why)

    def _read_claims(self) -> tuple[str | None, dict[str, Any]]:
        """The claims record (as stored, and read), once per term and after a lost claim."""
        if self._claims is None:
            election = self.lease.election
            with self.lease.observe("load_state"):
                found = self.records.load_some(election, [CLAIMS])
                if found is None:
                    found = self.records.load(election)
            raw = found.get(CLAIMS)
            try:
                claims = json.loads(raw) if raw is not None else {}
            except ValueError:
                claims = None
            if not isinstance(claims, dict):
                self.logger.error("celery-leader: unreadable %s record: replaced", CLAIMS)
                claims = {}
            self._claims = (raw, claims)
        return self._claims
