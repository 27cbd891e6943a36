"""The journal facet: short ordered logs of an election, written by any process.

The term history (a record per term, keyed by its epoch, written when the term
starts and again when it ends) and the audit trail (who changed which entry,
when and why) are logs of one election's journal. Records are opaque text; a
record's key sorts in its log's order (fixed-width numbers), and rewriting a
key replaces its record, so a term's record can be completed when it ends.
Writers hold no term: nothing fences a journal, and a log keeps only its
newest records, so it never grows past what a reader pages through.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class JournalWrite:
    """Record ``data`` under ``key`` in log ``log``, which then keeps its ``keep``
    greatest keys (``keep`` >= 1): one write drops what falls out, however many."""

    log: str
    key: str
    data: str
    keep: int


def journal_rounds(writes: Sequence[JournalWrite]) -> list[list[JournalWrite]]:
    """``writes`` cut, in order, into rounds in which each log has one ``keep``.

    For stores that apply a batch at once (a SQL statement, a transaction).
    Putting a round's records (a key's last one), then trimming each of its
    logs once to its ``keep``, leaves what applying them one by one does: the
    greatest keys of the greatest keys, with more keys added, are the greatest
    of them all. Callers seldom change a log's ``keep`` within a call: one
    round is the rule.
    """
    rounds: list[list[JournalWrite]] = []
    keeps: dict[str, int] = {}
    for w in writes:
        if not rounds or keeps.get(w.log, w.keep) != w.keep:
            rounds.append([])
            keeps = {}
        keeps[w.log] = w.keep
        rounds[-1].append(w)
    return rounds


class Journal(ABC):
    """Capped ordered logs per election."""

    @abstractmethod
    def write(self, election: str, writes: Sequence[JournalWrite]) -> None:
        """Apply ``writes`` in order, in one round trip (an audit record goes to the
        trail of the whole election and to its entry's in one call)."""

    @abstractmethod
    def read(
        self, election: str, log: str, limit: int, before: str | None = None
    ) -> list[tuple[str, str]]:
        """At most ``limit`` (key, record) pairs of ``log`` whose keys sort below
        ``before`` (all keys when ``None``), greatest key first: pages of a log."""
