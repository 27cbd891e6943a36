"""The ledger's few writes besides a worker's: beat's "sent" mark, and the marks
that say when beat may re-send (see :mod:`celery_leader.schedule.resend`)."""

from __future__ import annotations

import json
import os
import time

from ..backends import RunStore, RunWrite
from .records import RunRecord

#: An ``expected`` no record ever equals (records and marks are JSON objects): a
#: compare-and-set with it writes nothing and returns the stored record, so it
#: reads one key in one round trip. Plain text, because PostgreSQL refuses a NUL
#: in a text parameter.
_NEVER = "(read only)"


def read(runs: RunStore, election: str, key: str, retention: float) -> str | None:
    """The stored record of ``key`` (``None``: none), without changing it."""
    return runs.put(election, RunWrite(key, _NEVER, "", retention))[1]


def mark_sent(
    runs: RunStore,
    election: str,
    slot: str,
    instance_id: str,
    retention: float,
    keep: int,
    epoch: int | None = None,
) -> bool:
    """Record that beat published ``slot`` under ``epoch``, unless a worker recorded it
    first (``keep``: the runs its entry keeps, ``leader_ledger_keep``)."""
    record = RunRecord.sent_by(slot, instance_id, os.getpid(), time.time(), epoch)
    text = record.dump()
    return runs.put(election, RunWrite(slot, None, text, retention, keep, record.tally))[0]


def touch(
    runs: RunStore, election: str, key: str, what: dict[str, object], retention: float
) -> str:
    """Write the mark ``key`` if missing (an existing one keeps its content), else renew its
    expiry; the stored mark."""
    new = json.dumps(what, sort_keys=True)
    won, stored = runs.put(election, RunWrite(key, None, new, retention))
    if won or stored is None:
        return new
    runs.put(election, RunWrite(key, stored, stored, retention))
    return stored
