"""Which of the slots a leader sent no worker has started, and what to do about each.

With the run ledger on, a leader watches the slots it marked ``sent`` until their
records say a worker started them. A slot that stays ``sent`` has a message the broker
lost, or holds where no worker takes it: kombu's Redis transport takes a message off
its list (``BRPOP``) and records it as unacknowledged only afterwards, in the worker,
so a worker killed as the message reaches it loses it; the transport gives a dead
worker's unacknowledged messages back only after its visibility timeout; a Redis
restarted without persistence has lost what was queued.

One read of an entry's newest records judges all its watched slots:

* a slot of the entry sent *after* one has started, and that one has not: a queue
  hands out its messages in order, so the earlier message is gone (or held by a busy
  worker's prefetch). The slot was missed, and the entry's missed-slot policy decides
  (``all`` sends it again; ``once`` and ``skip`` do not, a newer slot having run);
* ``leader_ledger_resend_after`` seconds after its publish, a slot still not started
  is sent again, whatever came after it (an entry whose next slot is far off).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from datetime import datetime

from ..backends.run_store import run_entry
from ..ledger.records import SENT, RunRecord
from .jobs import Job

#: Seconds after a slot is sent that its entry's records are read: a slot starts within
#: milliseconds on a healthy queue, and one read (a round trip) judges every slot the
#: entry sent in this time.
LATER_START = 5.0
#: Records read beyond those an entry created since its oldest watched slot: records
#: others created meanwhile (a run now, a re-send of an earlier term's slot).
SLACK = 16

#: :class:`Verdict` reasons: the time bound passed; a later slot of the entry started.
LATE, MISSED = "late", "missed"


@dataclass(frozen=True, slots=True)
class Watched:
    """A slot marked ``sent`` at ``at`` (the lease's monotonic clock), the ``seq``-th of
    its entry's slots sent since the entry's watch began."""

    job: Job
    slot: str
    due: datetime
    at: float
    seq: int


@dataclass(frozen=True)
class Verdict:
    """A watched slot still not started: why (:data:`LATE`, :data:`MISSED`), its record as
    read (what a re-send's compare-and-set expects), and for :data:`MISSED` the later slot
    of its entry that started."""

    watched: Watched
    why: str
    stored: str
    record: RunRecord
    later: str | None = None


class StartWatch:
    """The slots a leader marked ``sent`` whose start it has not seen, by entry, and when
    to read each entry's records: :data:`LATER_START` after a slot is sent (one read for
    all the slots an entry sent meanwhile), and ``after`` seconds after the oldest one
    still not started then. On a healthy queue a slot is watched for those few seconds
    only, so the watch holds what was sent in the last :data:`LATER_START` seconds."""

    def __init__(self, after: float) -> None:
        #: ``leader_ledger_resend_after``.
        self.after = after
        self._slots: dict[str, list[Watched]] = {}  # by entry, oldest first
        #: Slots of each watched entry sent so far (a worker may record one before the
        #: leader marks it, and it is not watched, but it is one of the entry's records).
        self._sent: dict[str, int] = {}
        #: Heaps of ``(when, entry)``: reads for slots just sent, reads for slots past
        #: ``after``; each entry queued at most once in each (``_queued``).
        self._soon: list[tuple[float, str]] = []
        self._late: list[tuple[float, str]] = []
        self._queued: tuple[set[str], set[str]] = (set(), set())
        self._retry: list[str] = []

    def sent(self, job: Job, slot: str, due: datetime, at: float, marked: bool) -> None:
        """``slot`` was published at ``at``; ``marked``: its ``sent`` mark was written (a
        worker had not recorded it first), so it is watched."""
        entry = _entry(slot)
        if not marked:
            if entry in self._sent:
                self._sent[entry] += 1
            return
        seq = self._sent[entry] = self._sent.get(entry, 0) + 1
        self._slots.setdefault(entry, []).append(Watched(job, slot, due, at, seq))
        self._queue(0, at + LATER_START, entry)

    def due_reads(self, now: float) -> list[str]:
        """The entries whose records to read now, each once, those left unread first."""
        entries = dict.fromkeys(self._retry)
        self._retry = []
        for which, heap in enumerate((self._soon, self._late)):
            while heap and heap[0][0] <= now:
                entry = heapq.heappop(heap)[1]
                self._queued[which].discard(entry)
                entries[entry] = None
        return [entry for entry in entries if entry in self._slots]

    def unread(self, entries: list[str]) -> None:
        """``entries`` (from :meth:`due_reads`) were not read: read them at the next tick."""
        self._retry.extend(entries)

    def limit(self, entry: str) -> int:
        """How many of ``entry``'s newest records a read needs to find all its watched ones."""
        return self._sent[entry] - self._slots[entry][0].seq + 1 + SLACK

    def judge(self, entry: str, read: list[tuple[str, str]], now: float) -> list[Verdict]:
        """What ``read`` (``entry``'s newest records, newest created first) says of its watched
        slots at ``now``: a verdict for each one still not started that a later slot
        overtook or whose time bound passed. Those, the started and those not found
        (expired, or a record that is not the leader's) are no longer watched."""
        # The nearest slot created after each record that has started, if any.
        overtaken: dict[str, str | None] = {}
        texts: dict[str, str] = {}
        nearest: str | None = None
        for key, text in read:
            overtaken[key], texts[key] = nearest, text
            record = RunRecord.load(text, key)
            if record is not None and record.status != SENT:
                nearest = key
        verdicts: list[Verdict] = []
        kept: list[Watched] = []
        for watched in self._slots.pop(entry, []):
            stored = texts.get(watched.slot)
            record = None if stored is None else RunRecord.load(stored, watched.slot)
            if stored is None or record is None or record.status != SENT:
                continue
            later = overtaken[watched.slot]
            if later is not None:
                verdicts.append(Verdict(watched, MISSED, stored, record, later))
            elif now - watched.at >= self.after:
                verdicts.append(Verdict(watched, LATE, stored, record))
            else:
                kept.append(watched)
        if not kept:
            self._sent.pop(entry, None)
            return verdicts
        self._slots[entry] = kept
        # Not started yet: looked at again when a later slot of the entry is sent, and
        # at the time bound of the oldest; one sent just before this read, a moment on.
        self._queue(1, kept[0].at + self.after, entry)
        if now - kept[-1].at < LATER_START:
            self._queue(0, kept[-1].at + LATER_START, entry)
        return verdicts

    def _queue(self, which: int, when: float, entry: str) -> None:
        """A read of ``entry`` at ``when`` in heap ``which`` (0: soon, 1: late), unless one is
        queued there."""
        if entry not in self._queued[which]:
            self._queued[which].add(entry)
            heapq.heappush((self._soon, self._late)[which], (when, entry))


def _entry(slot: str) -> str:
    """The entry whose run records hold ``slot``'s (``"<entry>@<due time>"``)."""
    return run_entry(slot) or slot
