"""How tests read the run ledger: through the store's bounded per-entry calls."""

from __future__ import annotations

from celery_leader.backends import RunStore
from celery_leader.ledger import marks

#: Every test ledger keeps far fewer runs per entry than this.
ALL = 10_000


def record(store: RunStore, key: str, election: str = "beat") -> str | None:
    """The stored record (or mark) ``key``, read without a write."""
    return marks.read(store, election, key, 3600)


def slot_records(store: RunStore, election: str = "beat") -> dict[str, str]:
    """Every slot record of ``election``: each entry's runs, entry by entry."""
    out: dict[str, str] = {}
    for summary in store.summaries(election):
        out.update(store.runs_of(election, summary.entry, ALL))
    return out
