"""Loading a term's schedule state: adopt what is stored, anchor what is not.

The store is the truth of what was sent: a new leader continues where the last
one stopped. Stored state never moves backwards, with one exception named below:

* **An entry with no state** (new, or the store lost its data) is anchored at
  its series' anchor before now, with a claim, before anything is sent: our own
  memory of it may be older than what other leaders sent since, and a successor
  that found nothing would start the entry from its own promotion.
* **State ahead of this replica's clock** (a replica whose clock runs ahead wrote
  it, or ours runs behind) is kept: its entry waits until this clock passes it,
  with one WARNING. Moving it back would resend what the fast replica sent.
* **State ahead by more than** :data:`REPAIR_AFTER` cannot come from clock skew
  (a clock set to the wrong day, or a corrupt value): waiting would stop the
  entry for that long, so it is re-anchored at now, with one WARNING. The slots
  the fast replica sent early are then sent again when they really fall due.
* **Unreadable state** is replaced by an anchor, with one ERROR.
* **State of another generation** (the entry was deleted and re-created under
  its name, see :attr:`~celery_leader.schedule.jobs.Job.generation`) is
  replaced by an anchor: a re-created entry starts fresh and backfills nothing.
  State without a generation (written before generations existed) is adopted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import overload

from ..backends import Fence, FencedRecords
from ..exceptions import TermEnded
from ..lease import Lease
from .jobs import Job
from .state import Claim, dump_state, parse_state

#: Clock skew that goes unmentioned: replicas' clocks disagree by milliseconds.
MAX_CLOCK_SKEW = timedelta(seconds=1)

#: Stored state further ahead than this is repaired rather than waited for. It
#: is longer than any clock change (an hour, two in some zones' history) and any
#: skew NTP leaves, and shorter than a day, the typical wrong-date mistake.
REPAIR_AFTER = timedelta(hours=6)


@dataclass(slots=True)
class EntryState:
    """What the store records for one entry, as this leader last saw or wrote it.

    A leader holds one per entry, so it is kept small (slots, no caches): its
    next due time lives in the protocol's :class:`~celery_leader.schedule.due.DueIndex`.
    """

    raw: str | None  # the stored value: the ``expected`` of the next claim
    last_run_at: datetime  # UTC: the due time of the last slot recorded
    count: int
    generation: str | None = None  # the job's generation this state belongs to
    active_since: datetime | None = None  # the job's latest active_since, as stored


class StateSync:
    """Loads and anchors the schedule state of one election for its current term."""

    def __init__(self, lease: Lease, records: FencedRecords, logger: logging.Logger) -> None:
        self.lease = lease
        self.records = records
        self.logger = logger

    @overload
    def read(self) -> dict[str, str]: ...
    @overload
    def read(self, names: Sequence[str]) -> dict[str, str] | None: ...

    def read(self, names: Sequence[str] | None = None) -> dict[str, str] | None:
        """The election's stored state, in one round trip: all of it, or that of ``names``
        (``None`` when the store reads only all of it)."""
        lease = self.lease
        with lease.observe("load_state"):
            if names is None:
                return self.records.load(lease.election)
            return self.records.load_some(lease.election, names)

    def load(
        self, jobs: Sequence[Job], fence: Fence, now: datetime, stored: dict[str, str]
    ) -> dict[str, EntryState]:
        """The state of ``jobs``: adopted from ``stored`` (what :meth:`read` returned, for
        them at least), or anchored with one claim."""
        states: dict[str, EntryState] = {}
        anchors: list[Job] = []
        for job in jobs:
            adopted = self._adopt(job, stored.get(job.name), now)
            if adopted is None:
                anchors.append(job)
            else:
                states[job.name] = adopted
        self.anchor(anchors, fence, now, states, stored)
        return states

    def anchor(
        self,
        jobs: Sequence[Job],
        fence: Fence,
        now: datetime,
        states: dict[str, EntryState],
        stored: dict[str, str],
    ) -> None:
        """Anchor ``jobs`` at now in one claim round trip and add them to ``states``."""
        if not jobs:
            return
        lease = self.lease
        fresh = []
        for job in jobs:
            start = job.series.anchor(now) if job.series is not None else now
            new = dump_state(
                start,
                0,
                fence.term.epoch,
                lease.instance_id,
                generation=job.generation,
                active_since=job.active_since,
            )
            fresh.append((job, Claim(job.name, stored.get(job.name), new), start))
        with lease.observe("claim"):
            won = self.records.claim(fence, [c.write() for _, c, _ in fresh])
        if not any(won):
            # Every claim fails at once only when the term is no longer current.
            raise TermEnded(
                f"the term (epoch {fence.term.epoch}) ended while loading the schedule state"
            )
        if not all(won):
            raise TermEnded("another leader wrote the schedule state while this one loaded it")
        for job, claim, start in fresh:
            states[job.name] = EntryState(claim.new, start, 0, job.generation, job.active_since)

    def restamp(self, jobs: Sequence[Job], fence: Fence, states: dict[str, EntryState]) -> bool:
        """Record each job's newer ``active_since`` in the store, in one claim round trip.

        Done as soon as a leader sees an entry resumed or re-timed, not with its
        next slot: a successor promoted before that slot must not count the pause
        as missed. False when the stored state moved meanwhile (reload it).
        """
        lease = self.lease
        fresh = []
        for job in jobs:
            state = states[job.name]
            new = dump_state(
                state.last_run_at,
                state.count,
                fence.term.epoch,
                lease.instance_id,
                generation=state.generation,
                active_since=job.active_since,
            )
            after = EntryState(
                new, state.last_run_at, state.count, state.generation, job.active_since
            )
            fresh.append((job, Claim(job.name, state.raw, new), after))
        with lease.observe("claim"):
            won = self.records.claim(fence, [c.write() for _, c, _ in fresh])
        for (job, _, after), ok in zip(fresh, won, strict=True):
            if ok:
                states[job.name] = after
        return all(won)

    def _adopt(self, job: Job, raw: str | None, now: datetime) -> EntryState | None:
        """The stored state of ``job``, or ``None`` when it must be anchored."""
        if raw is None:
            return None
        state = parse_state(raw)
        if state is None:
            self.logger.error(
                "celery-leader: unreadable schedule state of %r: %.100r (replaced by an anchor "
                "at now)",
                job.name,
                raw,
            )
            return None
        if state.generation is not None and state.generation != job.generation:
            self.logger.info(
                "celery-leader: entry %r was re-created (generation %s, stored state of %s): "
                "it starts anew from now",
                job.name,
                job.generation,
                state.generation,
            )
            return None
        ahead = state.last_run_at - now
        if ahead > REPAIR_AFTER:
            self.logger.warning(
                "celery-leader: entry %r has a stored last_run_at in the future (%s, now %s, "
                "%s ahead; more than clock skew explains): starting it anew from now",
                job.name,
                state.last_run_at.isoformat(),
                now.isoformat(),
                _span(ahead),
            )
            return None
        if ahead > MAX_CLOCK_SKEW:
            self.logger.warning(
                "celery-leader: entry %r last sent a slot due %s, %s ahead of this replica's "
                "clock (now %s): it waits until this clock passes that (a replica's clock "
                "runs ahead, or this one's behind)",
                job.name,
                state.last_run_at.isoformat(),
                _span(ahead),
                now.isoformat(),
            )
        # The job's generation, also for a state written before generations: it is
        # the same entry, and the next claim records the generation.
        return EntryState(
            raw, state.last_run_at, state.total_run_count, job.generation, state.active_since
        )


def _span(delta: timedelta) -> str:
    """``delta`` for a log line: ``"12.5 s"``, ``"3.2 h"``."""
    seconds = delta.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
