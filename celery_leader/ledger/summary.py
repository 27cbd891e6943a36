"""Per-entry summary of the run ledger, for ``leader status``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .records import FAILURE, FINISHED, SENT, SKIPPED, STARTED, SUCCESS, RunRecord, is_slot


@dataclass
class EntryRuns:
    """What the ledger says of one entry: its last slot and counts over the retention."""

    entry: str
    last_slot: str
    #: ``sent``, ``running``, ``abandoned`` (its worker died mid-run) or ``finished``.
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


def summarize(records: Mapping[str, str], now: float) -> list[EntryRuns]:
    """One :class:`EntryRuns` per entry of the slot records in ``records``, by name."""
    by_entry: dict[str, list[RunRecord]] = {}
    for key, text in records.items():
        record = RunRecord.load(text) if is_slot(key) else None
        if record is not None:
            by_entry.setdefault(record.entry, []).append(record)
    out = []
    for entry, runs in sorted(by_entry.items()):
        # Slot names end in their due time, in one zone per entry: name order is time order.
        last = max(runs, key=lambda r: r.slot)
        summary = EntryRuns(
            entry,
            last.slot,
            _state(last, now),
            None if last.status == SENT else last.worker,
            None if last.status == SENT else last.started,
            last.finished,
            None if last.finished is None else last.finished - last.started,
            last.outcome,
            last.attempt,
        )
        for r in runs:
            summary.runs += r.outcome in (SUCCESS, FAILURE) or r.status == STARTED
            summary.failures += r.outcome == FAILURE
            summary.skips += r.outcome == SKIPPED
        out.append(summary)
    return out


def _state(record: RunRecord, now: float) -> str:
    if record.status == STARTED:
        return "running" if record.alive(now) else "abandoned"
    return "finished" if record.status == FINISHED else record.status
