"""One entry's run records held in a process (memory store) or a file (file store):
in write order, with its summary kept as they are written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .run_store import RUNS_DROPPED, RunSummary


@dataclass
class EntryBook:
    """The records of one entry: key -> (record, expiry, tally), oldest created first."""

    records: dict[str, tuple[str, float, str]] = field(default_factory=dict)
    last: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    def current(self, key: str, now: float) -> str | None:
        """The unexpired record of ``key``."""
        item = self.records.get(key)
        return item[0] if item is not None and item[1] > now else None

    def put(
        self,
        key: str,
        expected: str | None,
        new: str,
        expires: float,
        now: float,
        keep: int,
        tally: str,
        current: str | None = None,
    ) -> tuple[bool, str | None]:
        """Compare-and-set ``key`` (see ``RunStore.put``); ``current``: the
        record to compare with when this book holds none (one of an older format)."""
        self.drop_expired(now)
        stored = self.current(key, now)
        if stored is None:
            stored = current
        if stored != expected:
            return False, stored
        previous = self.records.get(key)
        if previous is not None:
            self.counts[previous[2]] = self.counts.get(previous[2], 0) - 1
            if previous[1] <= now:
                del self.records[key]  # expired: created anew, at the end
        self.records[key] = (new, expires, tally)  # a rewrite keeps its place
        self.counts[tally] = self.counts.get(tally, 0) + 1
        self.last = max(self.last, key)
        if keep > 0:
            for oldest in list(self.records)[: max(0, min(len(self.records) - keep, RUNS_DROPPED))]:
                self._remove(oldest)
        self._mend_last()
        return True, new

    def drop_expired(self, now: float) -> None:
        """Remove up to ``RUNS_DROPPED`` expired records, oldest created first."""
        expired = [k for k, (_, at, _) in list(self.records.items())[:RUNS_DROPPED] if at <= now]
        for key in expired:
            self._remove(key)
        self._mend_last()

    def newest(self, now: float, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` unexpired records, most recently created first."""
        out = []
        for key in reversed(self.records):
            value, at, _ = self.records[key]
            if at > now:
                out.append((key, value))
                if len(out) == limit:
                    break
        return out

    def summary(self, entry: str, now: float) -> RunSummary | None:
        """What :meth:`RunStore.summaries` says of this entry (``None``: nothing kept)."""
        if not any(at > now for _, at, _ in reversed(self.records.values())):
            return None
        counts = {tally: n for tally, n in self.counts.items() if n > 0 and tally}
        return RunSummary(entry, self.last, self.current(self.last, now), counts)

    def to_json(self) -> dict[str, Any]:
        """The book as a JSON object (the file store's per-entry file)."""
        records = [[k, v, at, tally] for k, (v, at, tally) in self.records.items()]
        return {"records": records, "last": self.last, "counts": self.counts}

    @classmethod
    def from_json(cls, data: Any) -> EntryBook:
        """The book in ``data``; an empty one when it is not one (damaged)."""
        try:
            records = {str(k): (str(v), float(at), str(t)) for k, v, at, t in data["records"]}
            counts = {str(t): int(n) for t, n in data["counts"].items()}
            return cls(records, str(data["last"]), counts)
        except (TypeError, ValueError, KeyError, AttributeError):
            return cls()

    def _remove(self, key: str) -> None:
        item = self.records.pop(key, None)
        if item is not None:
            self.counts[item[2]] = self.counts.get(item[2], 0) - 1

    def _mend_last(self) -> None:
        # The greatest key went (expired, or over the cap) while others stay:
        # the most recently created one stands for it.
        if self.last not in self.records:
            self.last = next(reversed(self.records), "")
