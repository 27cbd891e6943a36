"""Where and how long a worker writes its run-ledger records and overlap marks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..backends import RunStore, RunWrite


@dataclass(frozen=True)
class LedgerTarget:
    """The store, election and timings of one worker process's ledger writes."""

    runs: RunStore
    election: str
    #: The worker named in the records it writes.
    instance_id: str
    #: A running record's liveness reaches this far ahead of its last renewal.
    ttl: float
    renew_interval: float
    #: How long the store keeps a record.
    retention: float
    #: How many of an entry's runs the store keeps (0: all within the retention).
    keep: int
    clock: Callable[[], float] = field(default=time.time)

    def put(
        self, key: str, expected: str | None, text: str, tally: str = ""
    ) -> tuple[bool, str | None]:
        """Compare-and-set run record ``key`` of the election (see ``RunStore.put``)."""
        write = RunWrite(key, expected, text, self.retention, self.keep, tally)
        return self.runs.put(self.election, write)
