"""Per-entry summary of the run ledger, for ``leader status``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..backends import RunSummary
from .records import FAILURE, FINISHED, SENT, SKIPPED, STARTED, SUCCESS, TALLIES, RunRecord


@dataclass
class EntryRuns:
    """What the ledger says of one entry: its last slot and counts over the retention."""

    entry: str
    last_slot: str
    #: ``sent``, ``running``, ``abandoned`` (its worker died mid-run), ``finished``,
    #: or ``unknown`` (its record is gone, or not one celery-leader wrote).
    state: str
    worker: str | None
    started: float | None
    finished: float | None
    duration: float | None
    outcome: str | None
    attempt: int
    runs: int = 0
    failures: int = 0
    skips: int = 0

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON object."""
        return asdict(self)


def summarize(summaries: Sequence[RunSummary], now: float) -> list[EntryRuns]:
    """One :class:`EntryRuns` per entry of the store's ``summaries``, by name (nothing read
    per record); an entry whose last record celery-leader did not write shows its slot alone."""
    out = []
    for s in sorted(summaries, key=lambda s: s.entry):
        last = None if s.last is None else RunRecord.load(s.last, s.last_key)
        counts = s.counts
        out.append(
            EntryRuns(
                s.entry,
                s.last_key,
                "unknown" if last is None else _state(last, now),
                None if last is None or last.status == SENT else last.worker,
                None if last is None or last.status == SENT else last.started,
                None if last is None else last.finished,
                None
                if last is None or last.finished is None
                else last.finished - last.started,
                None if last is None else last.outcome,
                0 if last is None else last.attempt,
                # A run: it started (running, or its worker died) or it ended by running.
                runs=sum(counts.get(TALLIES[t], 0) for t in (STARTED, SUCCESS, FAILURE)),
                failures=counts.get(TALLIES[FAILURE], 0),
                skips=counts.get(TALLIES[SKIPPED], 0),
            )
        )
    return out


#: Runs ``leader entries show`` lists beside the summary (read by
#: :meth:`~celery_leader.backends.RunStore.runs_of`, newest first).
RECENT_RUNS = 10


def recent_run(key: str, text: str) -> dict[str, Any]:
    """One of an entry's recent runs as ``leader entries show`` lists it."""
    record = RunRecord.load(text, key)
    if record is None:
        return {"slot": key, "status": "unknown"}
    return {
        "slot": key,
        "status": record.status,
        "outcome": record.outcome,
        "worker": None if record.status == SENT else record.worker,
        "attempt": record.attempt,
    }


def _state(record: RunRecord, now: float) -> str:
    if record.status == STARTED:
        return "running" if record.alive(now) else "abandoned"
    return "finished" if record.status == FINISHED else record.status
