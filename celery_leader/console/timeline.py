"""The term timeline: the last terms of an election, the gap before each, and the
slots due in that gap with what became of each."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from ..election.history import TERMS_KEPT, term_history
from ..ledger.marks import read as read_run
from ..ledger.records import RunRecord
from ..schedule.state import slot_name
from .reads import Reads, iso
from .upcoming import due_times

#: Terms the timeline lists per election.
TERMS = 20
#: The most slots of a hand-over's gap the timeline looks up in the ledger
#: (one round trip each).
GAP_LOOKUPS = 50
#: The longest gap whose slots the timeline lists (a day's outage is a story
#: for the problems page, not a list of thousands of slots).
GAP_WINDOW = timedelta(hours=1)


def timeline(reads: Reads, election: str | None = None, limit: int = TERMS) -> dict[str, Any]:
    """The last terms of ``election`` (default: the beat election), newest first: holder,
    start, end, how it ended, and the gap before it with the slots due in that gap
    and what became of each (beat election only)."""
    name = election or reads.election
    limit = max(1, min(limit, TERMS_KEPT))
    terms = term_history(reads.store.journal, name, limit + 1)
    rows: list[dict[str, Any]] = []
    lookups = GAP_LOOKUPS
    for number, term in enumerate(terms[:limit]):
        before = terms[number + 1] if number + 1 < len(terms) else None
        row: dict[str, Any] = {
            "epoch": term.epoch,
            "holder": term.holder,
            "started": iso(term.started),
            "ended": iso(term.ended),
            "how": term.how or "leading",
            "gap": None,
            "gap_exact": True,
            "gap_slots": [],
        }
        gap_from = None
        if before is not None and before.ended is not None:
            gap_from = before.ended
        elif before is not None:
            # A lost term's end is unknown; its holder renewed within a ttl of the
            # next term's start, or that term would have started sooner: at most that.
            gap_from = max(before.started, term.started - reads.config.ttl)
            row["gap_exact"] = False
        if gap_from is not None:
            row["gap"] = round(term.started - gap_from, 3)
            if name == reads.election and lookups > 0:
                row["gap_slots"] = _gap_slots(reads, gap_from, term.started, lookups)
                lookups -= len(row["gap_slots"])
        rows.append(row)
    return {"election": name, "terms": rows}


def _gap_slots(reads: Reads, start: float, end: float, lookups: int) -> list[dict[str, Any]]:
    """The slots due in ``(start, end]`` and what the ledger says of each."""
    begin = datetime.fromtimestamp(start, timezone.utc)
    until = min(datetime.fromtimestamp(end, timezone.utc), begin + GAP_WINDOW)
    if until <= begin:
        return []
    index = reads.index()
    out = []
    for due in due_times(index).window(begin, until, lookups).slots:
        slot = slot_name(due.entry, due.due, index.zone)
        text = (
            read_run(reads.store.runs, reads.election, slot, reads.config.ledger_retention)
            if reads.config.ledger
            else None
        )
        record = None if text is None else RunRecord.load(text, slot)
        if record is None:
            fate = "not sent: dropped by the missed-slot policy, or not recorded"
        elif record.attempt > 1:
            fate = "run again: its worker died mid-run"
        elif record.started > end:
            fate = "sent late, by the next leader"
        else:
            fate = "sent before the hand-over"
        out.append({"entry": due.entry, "slot": slot, "due": due.due.isoformat(), "fate": fate})
    return out
