"""A request's reads of the store, each done at most once, for the views' data."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from ..backends import StoreFacets
from ..cli.entries import EntriesApp
from ..ledger.summary import EntryRuns, summarize
from ..settings.config import LeaderConfig
from .listing import EntryCache, EntryIndex


def iso(seconds: float | None) -> str | None:
    """Unix seconds as ISO 8601 UTC to the millisecond; ``None`` stays."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds")


class Reads:
    """One request's reads of the store, each done at most once."""

    def __init__(
        self, app: EntriesApp, store: StoreFacets, cache: EntryCache | None = None
    ) -> None:
        self.app = app
        self.store = store
        self.cache = EntryCache(app) if cache is None else cache
        self.config: LeaderConfig = app.config
        self.election = app.config.beat_election
        self._index: EntryIndex | None = None
        self._runs: dict[str, EntryRuns] | None = None

    def index(self) -> EntryIndex:
        """Every entry: the cache's, or from one read of the store's entries."""
        if self._index is None:
            self._index = self.cache.index(self.store.entries, self.election)
        return self._index

    def runs(self) -> dict[str, EntryRuns]:
        """Each entry's last run and counts (the ledger's summaries: one read)."""
        if self._runs is None:
            summaries = self.store.runs.summaries(self.election) if self.config.ledger else []
            self._runs = {r.entry: r for r in summarize(summaries, time.time())}
        return self._runs
