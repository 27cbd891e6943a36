"""The fenced-records facet: compare-and-set of opaque records under a term.

A write succeeds only while the writer's fence (its term) still holds the
election and the stored record is exactly the one it expects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .lock import Term


@dataclass(frozen=True)
class Fence:
    """A term of one election, as the elector hands it out to fence writes."""

    election: str
    term: Term


@dataclass(frozen=True)
class Write:
    """A fenced compare-and-set of one record: the stored ``key`` must be
    ``expected`` (``None``: nothing), and with both order keys set ``order`` must
    sort (as a string) strictly after ``after``."""

    key: str
    expected: str | None
    new: str
    order: str | None = None
    after: str | None = None

    def in_order(self) -> bool:
        """Whether the write comes after the record it replaces (True without keys)."""
        return self.order is None or self.after is None or self.after < self.order


#: What a compare-and-set keeps of each stored text (see :func:`apply_writes`).
_V = TypeVar("_V")


def unchanged(text: str) -> Any:
    """The ``keep`` that stores each text as it is (the memory store's, the file
    store's readers')."""
    return text


def apply_writes(
    state: dict[str, _V], writes: Sequence[Write], keep: Callable[[str], _V] = unchanged
) -> list[bool]:
    """Compare-and-set ``writes`` on ``state`` in place, in order; ``state`` holds what
    ``keep`` makes of each stored text (the memory store keeps the text, the file
    store's holder a digest)."""
    results = []
    for w in writes:
        stored = state.get(w.key)
        ok = stored is None if w.expected is None else stored == keep(w.expected)
        if ok:
            state[w.key] = keep(w.new)
        results.append(ok)
    return results


def write_rounds(writes: Sequence[Write]) -> list[list[int]]:
    """Write indexes in rounds: the n-th write of every key goes in round n."""
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, w in enumerate(writes):
        n = seen.get(w.key, 0)
        seen[w.key] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(i)
    return rounds


class FencedRecords(ABC):
    """Records of an election that only its current term may change."""

    @abstractmethod
    def load(self, election: str) -> dict[str, str]:
        """The records of ``election``: key -> value, as written."""

    def load_some(self, election: str, keys: Sequence[str]) -> dict[str, str] | None:
        """The records of ``keys`` that exist; ``None``: this store only has :meth:`load`."""
        return None

    def load_in_parts(self, election: str, progress: Callable[[], None]) -> dict[str, str]:
        """:meth:`load`, calling ``progress`` after each part of a read that takes more
        than one step (a new leader's tick watchdog counts them as progress: the file
        store's whole state took 2.5 to 8 s at a million entries). By default one part."""
        return self.load(election)

    def claim(self, fence: Fence, writes: Sequence[Write]) -> list[bool]:
        """Apply ``writes`` under ``fence`` in one round trip; one result per write.

        All fail when the fence's term no longer holds its election. A write
        that is not :meth:`~Write.in_order` fails without reaching the store.
        """
        admitted = [i for i, w in enumerate(writes) if w.in_order()]
        results = [False] * len(writes)
        if admitted:
            applied = self.compare_and_set(fence, [writes[i] for i in admitted])
            for i, ok in zip(admitted, applied, strict=True):
                results[i] = ok
        return results

    @abstractmethod
    def compare_and_set(self, fence: Fence, writes: Sequence[Write]) -> list[bool]:
        """The store's part of :meth:`claim`: fenced compare-and-set, one round trip.

        A write reported won is on as many replicas as ``replica_acks`` asks;
        otherwise the writes are handed back and StoreUnavailable is raised.
        """
