"""The fenced-records facet: compare-and-set of opaque records under a term.

A store keeps, per election, records by key: strings it never parses. A write
succeeds only while the writer's fence (its term) still holds the election and
the stored record is exactly the one the writer expects, so a deposed leader
can never write, and two writers can never both replace the same record.

The fence is composed by the caller: the elector hands out a :class:`Fence` for
the term it holds, and a claim takes it with its writes. Nothing here knows
what a lease is.

A write may also carry order keys (:attr:`Write.order`, :attr:`Write.after`):
strings the store compares and never parses, so that a record can only move
forward (a slot can never be claimed twice, whatever a writer's clock did).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from .lock import Term


@dataclass(frozen=True)
class Fence:
    """A term of one election, as the elector hands it out to fence writes.

    A write under it succeeds only while ``term`` still holds ``election``.
    """

    election: str
    term: Term


@dataclass(frozen=True)
class Write:
    """A fenced compare-and-set of one record.

    It succeeds only if the writer's term is still current and the stored record
    of ``key`` is exactly ``expected`` (``None``: nothing stored yet). With both
    order keys set it also fails unless ``order`` (the new record's key) sorts
    strictly after ``after`` (the key of the record it replaces): a "must come
    after" condition. The keys are compared as strings: writers encode them so
    that string order is their order (fixed-width timestamps, zero-padded numbers).
    """

    key: str
    expected: str | None
    new: str
    order: str | None = None
    after: str | None = None

    def in_order(self) -> bool:
        """Whether the write comes after the record it replaces (True without keys)."""
        return self.order is None or self.after is None or self.after < self.order


def apply_writes(state: dict[str, str], writes: Sequence[Write]) -> list[bool]:
    """Compare-and-set ``writes`` on ``state`` in place, in order; one result each.

    For stores that hold the state in process memory while fenced by a lock
    they already checked (memory, file).
    """
    results = []
    for w in writes:
        ok = state.get(w.key) == w.expected
        if ok:
            state[w.key] = w.new
        results.append(ok)
    return results


def write_rounds(writes: Sequence[Write]) -> list[list[int]]:
    """Write indexes in rounds: the n-th write of every key goes in round n.

    For stores that evaluate a whole batch against the state before it, so a
    batch may name each key only once (PostgreSQL statements, etcd transactions).
    """
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
        """The records of ``keys`` alone (those that exist), in one round trip.

        ``None``: this store reads only all records at once (:meth:`load`).
        A leader of a large schedule reads its state this way, chunk by chunk,
        and starts dispatching after the first chunk.
        """
        return None

    def claim(self, fence: Fence, writes: Sequence[Write]) -> list[bool]:
        """Apply ``writes`` under ``fence`` in one round trip; one result per write.

        All fail when the fence's term no longer holds its election. A write
        that is not :meth:`~Write.in_order` fails without reaching the store:
        the store compares ``expected`` with what it holds in the same step
        that applies the write, so the order key of ``expected`` is that of the
        stored record.
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

        A write reported won is on as many replicas as the store's
        ``replica_acks`` asks; when they do not acknowledge in time the writes are
        handed back and :class:`~celery_leader.exceptions.StoreUnavailable` is
        raised, so that nothing is acted on that a fail-over could undo.
        """
