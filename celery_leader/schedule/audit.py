"""The audit trail: who changed which schedule entry, when, and why.

Every change to an entry (from the console, the CLI or the Python API) is one
record in two logs of the election's journal: the election's whole trail and
the entry's own, written in one round trip, each keeping its newest
``leader_audit_keep`` records.
"""

from __future__ import annotations

import getpass
import json
import secrets
import socket
from dataclasses import asdict, dataclass, field
from typing import Any

from ..backends import Journal, JournalWrite

#: The journal log of an election's whole trail; an entry's is ``audit/<entry>``.
AUDIT = "audit"

#: Records each trail keeps (the election's, and each entry's).
AUDIT_KEEP = 1000


def entry_log(entry: str) -> str:
    """The journal log of one entry's trail."""
    return f"{AUDIT}/{entry}"


def local_actor() -> str:
    """Who makes a change from this process when no one else is named: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class AuditRecord:
    """One change: when (wall-clock seconds), who, what (``action``: ``add``,
    ``update``, ``remove``, ``pause``, ``resume``, ``run``), to which entry, why,
    and the action's particulars (``details``: a pause's ``until``, the changed
    fields)."""

    at: float
    who: str
    action: str
    entry: str
    why: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def dump(self) -> str:
        """The record as the journal keeps it (JSON)."""
        return json.dumps(asdict(self), separators=(",", ":"), default=str)

    @classmethod
    def load(cls, text: str) -> AuditRecord | None:
        """The record ``text`` holds; ``None`` for one this version cannot read."""
        try:
            data = json.loads(text)
            details = data.get("details") or {}
            if not isinstance(details, dict):
                return None
            why = data.get("why")
            return cls(
                float(data["at"]),
                str(data["who"]),
                str(data["action"]),
                str(data["entry"]),
                None if why is None else str(why),
                details,
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def record_change(journal: Journal, election: str, record: AuditRecord, keep: int) -> None:
    """Add ``record`` to the election's trail and its entry's (one round trip)."""
    # Microseconds, then a random tail: two changes in one microsecond from two
    # processes both stay, and keys still sort by time.
    key = f"{round(record.at * 1e6):020d}-{secrets.token_hex(4)}"
    text = record.dump()
    journal.write(
        election,
        [
            JournalWrite(AUDIT, key, text, keep),
            JournalWrite(entry_log(record.entry), key, text, keep),
        ],
    )


def audit_trail(
    journal: Journal,
    election: str,
    limit: int,
    entry: str | None = None,
    before: str | None = None,
) -> list[tuple[str, AuditRecord]]:
    """Up to ``limit`` changes (of ``entry``, or of every entry), newest first, with
    their keys; pass the last key as ``before`` for the next page."""
    log = AUDIT if entry is None else entry_log(entry)
    pairs = journal.read(election, log, limit, before)
    return [(key, record) for key, text in pairs if (record := AuditRecord.load(text))]
