"""What a run record says, as JSON (never pickle: the store is shared).

Stored as a JSON array ``[state, worker, pid, started, alive for, attempt, took, reason,
epoch]``: ``state`` is a letter of :data:`TALLIES`; ``alive for`` and ``took`` are seconds
after ``started``, which is seconds after the slot's due time where the slot names one;
``epoch`` is the leader's term the slot was sent under (its ``leader_epoch``); times to
the millisecond, trailing nulls left out. About 50 bytes (the epoch adds up to a dozen),
against some 220 as the JSON object earlier releases wrote (still read). A reader ignores
what follows the fields it knows, so a field added at the end leaves it reading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

#: ``status`` values: beat sent it (no worker has started it yet); the body is
#: running (or its worker died running it); it ended.
SENT, STARTED, FINISHED = "sent", "started", "finished"
#: ``outcome`` values of a finished record.
SUCCESS, FAILURE, SKIPPED = "success", "failure", "skipped"


@dataclass(frozen=True)
class RunRecord:
    """One slot's run: who started it, until when it is known alive, how it ended (Unix
    seconds on the writer's clock; ``attempt`` counts starts, ``reason`` why skipped)."""

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
    #: The leader's epoch the slot was sent under; ``None``: not known (a record of an
    #: earlier release, or a message without the ``leader_epoch`` header).
    epoch: int | None = None

    @classmethod
    def sent_by(
        cls, slot: str, instance_id: str, pid: int, at: float, epoch: int | None = None
    ) -> RunRecord:
        """Beat's mark: ``slot`` was published (``started`` is when) under ``epoch``,
        nobody runs it yet."""
        return cls(slot, SENT, instance_id, pid, at, 0.0, attempt=0, epoch=epoch)

    @property
    def entry(self) -> str:
        """The schedule entry of the slot (``"<entry>@<due time>"``)."""
        return self.slot.rpartition("@")[0]

    def alive(self, now: float) -> bool:
        """Started, and its worker renewed its liveness recently enough."""
        return self.status == STARTED and now < self.alive_until

    @property
    def state(self) -> str:
        """Its outcome when it ended, else its status (``sent``, ``started``)."""
        return self.outcome if self.status == FINISHED and self.outcome else self.status

    @property
    def tally(self) -> str:
        """What the entry's summary counts this record under: one letter a state
        (see :data:`TALLIES`), a byte of every stored record."""
        return TALLIES.get(self.state, "")

    def dump(self) -> str:
        """The record as stored: a compact JSON array (see the module docstring)."""
        values: list[Any] = [
            self.tally,
            self.worker,
            self.pid,
            _ms(self.started - _due(self.slot)),
            _ms(self.alive_until - self.started) if self.alive_until else None,
            self.attempt,
            None if self.finished is None else _ms(self.finished - self.started),
            self.reason,
            self.epoch,
        ]
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
                return cls._from_array(slot, *data)
            return cls(**{**data, "slot": slot}) if isinstance(data, dict) else None
        except (TypeError, ValueError, KeyError):
            return None

    @classmethod
    def _from_array(
        cls,
        slot: str,
        state: str,
        worker: str,
        pid: int,
        started: float,
        alive_for: float | None = None,
        attempt: int = 1,
        took: float | None = None,
        reason: str | None = None,
        epoch: int | None = None,
        *later: object,  # fields a later release added: not known here, ignored
    ) -> RunRecord:
        state = _STATES[state]
        ended = state in (SUCCESS, FAILURE, SKIPPED)
        if abs(started) < _RELATIVE:
            started = round(started + _due(slot), 3)
        return cls(
            slot,
            FINISHED if ended else state,
            worker,
            pid,
            started,
            0.0 if alive_for is None else round(started + alive_for, 3),
            attempt,
            None if took is None else round(started + took, 3),
            state if ended else None,
            reason,
            epoch if type(epoch) is int else None,
        )


#: The letter an entry's summary counts each state under (``RunRecord.tally``).
TALLIES = {SENT: "s", STARTED: "r", SUCCESS: "o", FAILURE: "f", SKIPPED: "k"}
_STATES = {letter: state for state, letter in TALLIES.items()}
#: A stored start this close to 0 is seconds after its slot's due time, not a
#: Unix time: three years, where any Unix time since 1973 is larger, and no
#: slot starts that long after its due time (its record expires long before).
_RELATIVE = 1e8


def _due(slot: str) -> float:
    """The due time a slot name ends in, Unix seconds; 0 when it names none."""
    try:
        return datetime.fromisoformat(slot.rpartition("@")[2]).timestamp()
    except ValueError:
        return 0.0


def _ms(seconds: float) -> float | int:
    """Times to the millisecond (what a record is for needs no finer); a whole
    number without its ``.0``."""
    rounded = round(seconds, 3)
    return int(rounded) if rounded.is_integer() else rounded


#: Keys of the ledger that are not slots (slot names are ``"<entry>@<time>"``).
MARK = "@"
#: Beat re-sends slots claimed after this mark's time (when the ledger was turned on).
SINCE = "@ledger-since"
#: Rewritten by workers whose dedup step is on: beat re-sends only while it exists.
WORKERS = "@ledger-workers"


def is_slot(key: str) -> bool:
    """Whether a ledger key names a slot (rather than a mark)."""
    return not key.startswith(MARK)
