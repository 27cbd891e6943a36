"""The entries facet: schedule entries any process may edit without a term, versioned."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    """An unfenced compare-and-set of an entry: ``expected`` -> ``new`` (``None``: none)."""

    key: str
    expected: str | None
    new: str | None


def apply_edits(entries: dict[str, str], edits: Sequence[Edit]) -> list[bool]:
    """Compare-and-set ``edits`` on ``entries`` in place, in order; one result each."""
    results = []
    for e in edits:
        ok = entries.get(e.key) == e.expected
        if ok:
            if e.new is None:
                entries.pop(e.key, None)
            else:
                entries[e.key] = e.new
        results.append(ok)
    return results


class EntryStore(ABC):
    """The schedule entries of elections, and a version that moves with each edit."""

    @abstractmethod
    def version(self, election: str) -> int:
        """A number that changes whenever an entry of ``election`` is edited (0: never)."""

    @abstractmethod
    def load(self, election: str) -> tuple[int, dict[str, str]]:
        """The entries version (read first) and the entries of ``election``, as written."""

    def load_one(self, election: str, name: str) -> str | None:
        """The stored text of entry ``name`` of ``election``; ``None``: no such entry.
        One bounded read where the store reads by key (an edit of one entry through
        the API reads that entry alone, whatever the schedule holds)."""
        return self.load(election)[1].get(name)

    def load_pages(self, election: str) -> tuple[int, Iterator[dict[str, str]]]:
        """The entries version (read first), then the entries of ``election`` page by
        page, each page one bounded read made when the caller asks for it: a reader
        can act on the first page while the rest of a large schedule is still coming.
        A page may repeat an entry of an earlier page; an edit made during the reading
        shows in :meth:`changes_since` of the version returned."""
        version, texts = self.load(election)
        return version, iter([texts])

    def changes_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        """The entries edited after ``version`` (name -> value, ``None``: removed),
        with the version that brings a reader to, in one round trip; ``None``:
        the store cannot tell (read every entry with :meth:`load`)."""
        return None

    @abstractmethod
    def edit(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        """Apply ``edits`` (no term needed), one result each; any applied moves the version."""


class PagedEntryStore(EntryStore):
    """An entries facet that reads by pages: :meth:`load` is every page, joined."""

    def load(self, election: str) -> tuple[int, dict[str, str]]:
        version, pages = self.load_pages(election)
        entries: dict[str, str] = {}
        for page in pages:
            entries.update(page)
        return version, entries

    @abstractmethod
    def load_pages(self, election: str) -> tuple[int, Iterator[dict[str, str]]]: ...
