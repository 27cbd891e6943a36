"""Run records on Redis: per entry a hash, its creation order and a summary; marks apart."""

from __future__ import annotations

import math

from ..run_store import RUNS_DROPPED, RunStore, RunSummary, RunWrite, run_entry
from .connection import Connection, has, seconds

#: Run records per script call, and summaries per pipelined round trip: each
#: call is far under a millisecond of the server's time.
RUNS_PAGE = 500
SUMMARIES_PAGE = 200


class RedisRuns(RunStore):
    """Run records of elections on one Redis."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def _entry_keys(self, election: str, entry: str) -> list[str]:
        """The records, creation order and summary of ``entry``'s run records."""
        return self._conn.keys(election, f"run:{entry}", f"run-order:{entry}", f"run-sum:{entry}")

    def put(self, election: str, write: RunWrite) -> tuple[bool, str | None]:
        key, expected, ttl_ms = write.key, write.expected, max(1, math.ceil(write.ttl * 1000))
        cas = [has(expected), expected or "", write.new, ttl_ms]
        marks = self._conn.keys(election, "runs", "runs-expiry")
        entry = run_entry(key)
        if entry is None:
            reply = self._conn.run("put_run", marks, [key, *cas])
        else:
            args = [entry, key, key[len(entry) + 1 :], *cas, write.keep, write.tally, RUNS_DROPPED]
            keys = [*self._entry_keys(election, entry), self._conn.key(election, "run-entries")]
            reply = self._conn.run("put_entry_run", keys + marks, args)
        stored = reply[1]
        return bool(int(reply[0])), None if stored in (None, False) else str(stored)

    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        keys = self._entry_keys(election, entry)
        out: list[tuple[str, str]] = []
        start = 0
        while len(out) < limit:
            # A page of ranks (from the newest created), not of live records: an expired
            # one is skipped, so the next page starts where this one's ranks ended.
            count = min(RUNS_PAGE, limit - len(out))
            flat = self._conn.run("runs_of", keys, [start, start + count - 1])
            out += [(f"{entry}@{flat[i]}", str(flat[i + 1])) for i in range(0, len(flat), 2)]
            start += count
            if start >= self._conn.call(lambda c: c.llen(keys[1])):
                break
        return out[:limit]

    def summaries(self, election: str) -> list[RunSummary]:
        index, lock = self._conn.keys(election, "run-entries", "lock")
        now_ms = seconds(self._conn.run("time", [lock], [])) * 1000
        out: list[RunSummary] = []
        cursor = 0
        while True:
            cursor, page = self._conn.call(
                lambda c, at=cursor: c.zscan(index, at, count=SUMMARIES_PAGE)
            )
            entries = sorted(str(e) for e, until in page if until > now_ms)
            out += self._summaries(election, entries, now_ms)
            if not cursor:
                return sorted(out, key=lambda s: s.entry)

    def _summaries(self, election: str, entries: list[str], now_ms: float) -> list[RunSummary]:
        """The summaries of ``entries``: two pipelined round trips of small reads."""
        keys = [self._entry_keys(election, e) for e in entries]
        found = self._conn.pipelined(lambda pipe: [pipe.hgetall(summary) for _, _, summary in keys])
        lasts = [str(f.get("last", "")) for f in found]
        read = self._conn.pipelined(
            lambda pipe: [pipe.hget(k[0], last) for k, last in zip(keys, lasts, strict=True)]
        )
        out = []
        for entry, fields, last, stored in zip(entries, found, lasts, read, strict=True):
            if not last:
                continue
            # As stored: "<tally>|<expiry, ms in base 36>|<record>".
            _, expiry, record = str(stored).split("|", 2) if stored else ("", "0", "")
            counts = {
                str(k)[2:]: int(v) for k, v in fields.items() if str(k).startswith("n:") and int(v)
            }
            live = int(expiry, 36) > now_ms
            out.append(RunSummary(entry, f"{entry}@{last}", record if live else None, counts))
        return out
