"""The run-records facet: what workers write of each run (the run ledger).

Run records are written by workers, which hold no term, so no term fences
them. A record's key is ``"<entry>@<order>"`` (see :func:`run_entry`): the store
keeps each entry's records apart and a summary per entry up to date as they
are written, so a reader pays for what it shows, never for every record kept.
A key starting with ``@`` is a mark: kept, never summarized.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

#: Expired or excess run records one :meth:`RunStore.put` removes at most: a
#: write never pays for more than a bounded clean-up, and an entry written once
#: a second still sheds its expired records far faster than it gains them.
RUNS_DROPPED = 100


def run_entry(key: str) -> str | None:
    """The entry of run record ``key`` (``"<entry>@<order>"``); ``None`` for a mark
    (a key starting with ``@``) or a key without ``@``."""
    if key.startswith("@"):
        return None
    entry, at, _ = key.rpartition("@")
    return entry if at else None


@dataclass(frozen=True)
class RunWrite:
    """An unfenced compare-and-set of one run record.

    It succeeds when the stored record of ``key`` is exactly ``expected``
    (``None``: none, or an expired one), atomically with the comparison; the
    record then expires ``ttl`` seconds later by the store's clock. For a record
    of an entry, ``tally`` is the label its entry's summary counts it under
    (``""``: none), and with ``keep`` > 0 the entry keeps only its ``keep`` most
    recently created records (rewriting a record does not move it: slots are
    created in their order).
    """

    key: str
    expected: str | None
    new: str
    ttl: float
    keep: int = 0
    tally: str = ""


@dataclass(frozen=True)
class RunSummary:
    """What a store keeps of one entry's run records, up to date with every write.

    ``last_key`` is the entry's greatest key kept (keys of one entry sort in
    their order; a store that dropped it while others stay may name its newest
    created instead), ``last`` its record (``None`` if it expired before the
    others); ``counts`` is how many kept records carry each tally.
    """

    entry: str
    last_key: str
    last: str | None
    counts: dict[str, int]


class RunStore(ABC):
    """Run records of elections, per entry, with a summary per entry."""

    @abstractmethod
    def put(self, election: str, write: RunWrite) -> tuple[bool, str | None]:
        """Apply ``write`` in one round trip.

        Returns whether it succeeded and the record stored now (``None`` when
        there is none, or, after a lost write, when the store cannot tell
        without another round trip). A write removes at most
        :data:`RUNS_DROPPED` expired or excess records, so expiry costs what
        expired, never a scan.
        """

    @abstractmethod
    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        """The unexpired records of ``entry``, at most ``limit`` of them, most
        recently created first: (key, record) pairs, read in bounded pages."""

    @abstractmethod
    def summaries(self, election: str) -> list[RunSummary]:
        """One :class:`RunSummary` per entry with unexpired records, read in
        bounded pages: the cost grows with the entries, not their records."""
