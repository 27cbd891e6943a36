"""The run-records facet: what workers write of each run (the run ledger).

Unfenced (workers hold no term). A key is ``"<entry>@<order>"`` (:func:`run_entry`);
a key starting with ``@`` is a mark: kept, never summarized.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

#: Expired or excess run records one :meth:`RunStore.put` removes at most: a write
#: never pays for more than a bounded clean-up.
RUNS_DROPPED = 100


def run_entry(key: str) -> str | None:
    """The entry of run record ``key`` (``<entry>@<order>``); ``None`` for a mark."""
    if key.startswith("@"):
        return None
    entry, at, _ = key.rpartition("@")
    return entry if at else None


@dataclass(frozen=True)
class RunWrite:
    """An unfenced compare-and-set of one run record (``expected`` ``None``: none,
    or an expired one); it expires ``ttl`` seconds later by the store's clock.
    ``tally``: the label the entry's summary counts it under; ``keep`` > 0: the
    entry keeps only its ``keep`` most recently created records."""

    key: str
    expected: str | None
    new: str
    ttl: float
    keep: int = 0
    tally: str = ""


@dataclass(frozen=True)
class RunSummary:
    """One entry's greatest key kept, its record (``None``: expired) and tally counts."""

    entry: str
    last_key: str
    last: str | None
    counts: dict[str, int]


class RunStore(ABC):
    """Run records of elections, per entry, with a summary per entry."""

    @abstractmethod
    def put(self, election: str, write: RunWrite) -> tuple[bool, str | None]:
        """Apply ``write`` in one round trip: whether it succeeded, and the record
        stored now (``None``: none, or unknown after a lost write). It removes
        at most :data:`RUNS_DROPPED` expired or excess records."""

    @abstractmethod
    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        """The unexpired records of ``entry`` (at most ``limit``), newest created first."""

    @abstractmethod
    def summaries(self, election: str) -> list[RunSummary]:
        """One :class:`RunSummary` per entry with unexpired records, in bounded pages."""
