"""Schedule entries on Redis: the hash ``{p:e}:entries``, its version and recent changes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..entry_store import Edit, PagedEntryStore
from .connection import Connection, has
from .scripts import wrong_type

#: Entries per HSCAN page: a few MB, milliseconds of the server's time.
ENTRIES_PAGE = 10_000

#: Entry edits the store remembers by name (a reader further behind reads every
#: entry): bounds what a read of the changes returns and their memory.
CHANGES_KEPT = 10_000


class RedisEntries(PagedEntryStore):
    """Schedule entries of elections on one Redis."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def _keys(self, election: str) -> list[str]:
        return self._conn.keys(election, "entries", "entries-version", "entries-changes")

    def version(self, election: str) -> int:
        key = self._conn.key(election, "entries-version")
        return int(self._conn.call(lambda c: c.get(key)) or 0)

    def load_one(self, election: str, name: str) -> str | None:
        entries = self._conn.key(election, "entries")
        return self._conn.call(lambda c: c.hget(entries, name))  # type: ignore[no-any-return]

    def load_pages(self, election: str) -> tuple[int, Iterator[dict[str, str]]]:
        # By pages: one HGETALL of a million entries blocked the server for seconds.
        # The version first: an edit during the scan shows in the changes since it, and
        # HSCAN returns every entry that stays for the whole scan.
        entries, version, _ = self._keys(election)
        kind, number = self._conn.pipelined(lambda pipe: (pipe.type(entries), pipe.get(version)))
        if kind not in ("hash", "none"):
            raise wrong_type(entries, kind)

        def pages() -> Iterator[dict[str, str]]:
            cursor = 0
            while True:
                cursor, page = self._conn.call(
                    lambda c, at=cursor: c.hscan(entries, at, count=ENTRIES_PAGE)
                )
                yield page
                if not cursor:
                    return

        return int(number or 0), pages()

    def changes_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        reply = self._conn.run("entries_since", self._keys(election), [version])
        if not reply[1]:
            return None
        flat = reply[2:]
        return int(reply[0]), dict(zip(flat[::2], flat[1::2], strict=True))

    def edit(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        if not edits:
            return []
        args: list[Any] = [CHANGES_KEPT]
        for e in edits:
            args += (e.key, has(e.expected), e.expected or "", has(e.new), e.new or "")
        return [bool(r) for r in self._conn.run("edit_entries", self._keys(election), args)]
