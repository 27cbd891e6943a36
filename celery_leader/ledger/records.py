"""What a run record says, as JSON (never pickle: the store is shared).

A record is stored as a JSON array, its fields in :data:`_FIELDS` order with
trailing nulls left out and times to the millisecond; its slot is the key it is
stored under. A million records are a few hundred MB less this way than as
objects naming every field, the form of earlier releases, which still reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

#: ``status`` values: beat sent it (no worker has started it yet); the body is
#: running (or its worker died running it); it ended.
SENT, STARTED, FINISHED = "sent", "started", "finished"
#: ``outcome`` values of a finished record.
SUCCESS, FAILURE, SKIPPED = "success", "failure", "skipped"


@dataclass(frozen=True)
class RunRecord:
    """One slot's run: who started it, until when it is known alive, how it ended.

    Times are Unix seconds on the writing worker's clock. ``attempt`` counts the
    starts (a rerun after a dead worker is attempt 2); ``reason`` says why a
    record ended skipped.
    """

    slot: str
    status: str
    worker: str
    pid: int
    started: float
    alive_until: float
    attempt: int = 1
    finished: float | None = None
    outcome: str | None = None
    reason: str | None = None

    @classmethod
    def sent_by(cls, slot: str, instance_id: str, pid: int, at: float) -> RunRecord:
        """Beat's mark: ``slot`` was published (``started`` is when), nobody runs it yet."""
        return cls(slot, SENT, instance_id, pid, at, 0.0, attempt=0)

    @property
    def entry(self) -> str:
        """The schedule entry of the slot (``"<entry>@<due time>"``)."""
        return self.slot.rpartition("@")[0]

    def alive(self, now: float) -> bool:
        """Started, and its worker renewed its liveness recently enough."""
        return self.status == STARTED and now < self.alive_until

    @property
    def tally(self) -> str:
        """What the entry's summary counts this record as: its outcome when it
        ended, else its status (``sent``, ``started``)."""
        return self.outcome if self.status == FINISHED and self.outcome else self.status

    def dump(self) -> str:
        """The record as stored: a compact JSON array (see the module docstring)."""
        values: list[Any] = [_ms(getattr(self, name)) for name in _FIELDS]
        while values and values[-1] is None:
            values.pop()
        return json.dumps(values, separators=(",", ":"))

    def ended(self, at: float, outcome: str, reason: str | None = None) -> RunRecord:
        """This run, finished at ``at`` with ``outcome``."""
        return replace(self, status=FINISHED, finished=at, outcome=outcome, reason=reason)

    @classmethod
    def load(cls, text: str, slot: str) -> RunRecord | None:
        """The record of ``slot`` in ``text``; ``None`` when it is not one (foreign
        or damaged). Reads the object form of earlier releases too."""
        try:
            data = json.loads(text)
            if isinstance(data, list):
                data = dict(zip(_FIELDS, data, strict=False))
            return cls(**{**data, "slot": slot}) if isinstance(data, dict) else None
        except (TypeError, ValueError):
            return None


#: The stored fields, in their order in a stored record (every field but ``slot``).
_FIELDS = [f.name for f in fields(RunRecord) if f.name != "slot"]


def _ms(value: Any) -> Any:
    """Times to the millisecond: what a record is for needs no finer."""
    return round(value, 3) if isinstance(value, float) else value


#: Keys of the ledger that are not slots (slot names are ``"<entry>@<time>"``).
MARK = "@"
#: Beat re-sends slots claimed after this mark's time (when the ledger was turned on).
SINCE = "@ledger-since"
#: Rewritten by workers whose dedup step is on: beat re-sends only while it exists.
WORKERS = "@ledger-workers"


def is_slot(key: str) -> bool:
    """Whether a ledger key names a slot (rather than a mark)."""
    return not key.startswith(MARK)
