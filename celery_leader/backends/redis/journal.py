"""The journal on Redis: per log, a hash of its records and a sorted set of its keys."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from ..journal import Journal, JournalWrite
from .connection import Connection


class RedisJournal(Journal):
    """Journal logs of elections on one Redis."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def _keys(self, election: str, log: str) -> list[str]:
        """The records and the keys of ``log``. Its name is percent-encoded: any
        text stays one key's name, and none ends like a key listed by pattern
        (``{p:*}:epoch``) nor holds a brace that could move the hash tag."""
        name = quote(log, safe="/")
        return self._conn.keys(election, f"journal:{name}", f"journal-keys:{name}")

    def write(self, election: str, writes: Sequence[JournalWrite]) -> None:
        if not writes:
            return
        logs: dict[str, int] = {}
        keys: list[str] = []
        args: list[Any] = []
        for w in writes:
            if w.log not in logs:
                logs[w.log] = len(logs) + 1
                keys += self._keys(election, w.log)
            args += (logs[w.log], w.key, w.data, w.keep)
        self._conn.run("journal_write", keys, args)

    def read(
        self, election: str, log: str, limit: int, before: str | None = None
    ) -> list[tuple[str, str]]:
        if limit <= 0:
            return []
        below = "+" if before is None else f"({before}"
        flat = self._conn.run("journal_read", self._keys(election, log), [limit, below])
        return [(str(flat[i]), str(flat[i + 1])) for i in range(1, len(flat), 2)]
