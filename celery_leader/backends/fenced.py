"""The fenced-state interface: compare-and-set of opaque records under a term.

A store keeps, per election, records by key: strings it never parses. A write
succeeds only while the writer's term still holds the election and the stored
record is exactly the one the writer expects, so a deposed leader can never
write, and two writers can never both replace the same record.

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


#: Expired or excess run records one :meth:`FencedState.put_run` removes at
#: most: a write never pays for more than a bounded clean-up, and an entry
#: written once a second still sheds its expired records far faster than it
#: gains them.
RUNS_DROPPED = 100


def run_entry(key: str) -> str | None:
    """The entry of run record ``key`` (``"<entry>@<order>"``); ``None`` for a mark
    (a key starting with ``@``) or a key without ``@``."""
    if key.startswith("@"):
        return None
    entry, at, _ = key.rpartition("@")
    return entry if at else None


@dataclass(frozen=True)
class RunSummary:
    """What a store keeps of one entry's run records, up to date with every write.

    ``last_key`` is the entry's greatest key kept (keys of one entry sort in
    their order; a store that dropped it while others stay may name its newest
    created instead), ``last`` its record (``None`` if it expired before the
    others); ``counts`` is how many kept records carry each tally.
    """

    entry: str
    last_key: str
    last: str | None
    counts: dict[str, int]


@dataclass(frozen=True)
class Edit:
    """An unfenced compare-and-set of one schedule entry: any process may make it.

    It succeeds only if the stored entry ``key`` is exactly ``expected``
    (``None``: no such entry); ``new`` replaces it, ``None`` removes it.
    """

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


class FencedState(ABC):
    """Records of an election that only its current term may change."""

    @abstractmethod
    def load_state(self, election: str) -> dict[str, str]:
        """The records of ``election``: key -> value, as written."""

    def load_state_of(self, election: str, keys: Sequence[str]) -> dict[str, str] | None:
        """The records of ``keys`` alone (those that exist), in one round trip.

        ``None``: this store reads only all records at once (:meth:`load_state`).
        A leader of a large schedule reads its state this way, chunk by chunk,
        and starts dispatching after the first chunk.
        """
        return None

    def claim(self, election: str, term: Term, writes: Sequence[Write]) -> list[bool]:
        """Apply ``writes`` in one round trip; one result per write.

        All fail when ``term`` no longer holds ``election``. A write that is not
        :meth:`~Write.in_order` fails without reaching the store: the store
        compares ``expected`` with what it holds in the same step that applies
        the write, so the order key of ``expected`` is that of the stored record.
        """
        admitted = [i for i, w in enumerate(writes) if w.in_order()]
        results = [False] * len(writes)
        if admitted:
            applied = self.compare_and_set(election, term, [writes[i] for i in admitted])
            for i, ok in zip(admitted, applied, strict=True):
                results[i] = ok
        return results

    @abstractmethod
    def compare_and_set(self, election: str, term: Term, writes: Sequence[Write]) -> list[bool]:
        """The store's part of :meth:`claim`: fenced compare-and-set, one round trip.

        A write reported won is on as many replicas as the store's
        ``replica_acks`` asks; when they do not acknowledge in time the writes are
        handed back and :class:`~celery_leader.exceptions.StoreUnavailable` is
        raised, so that nothing is acted on that a fail-over could undo.
        """

    # -- run records: written by workers, which hold no term ------------------
    #
    # A run record's key is ``"<entry>@<order>"`` (see :func:`run_entry`): the
    # store keeps each entry's records apart and a summary per entry up to date
    # as they are written, so a reader pays for what it shows, never for every
    # record kept. A key starting with ``@`` is a mark: kept, never summarized.

    @abstractmethod
    def put_run(
        self,
        election: str,
        key: str,
        expected: str | None,
        new: str,
        ttl: float,
        *,
        keep: int = 0,
        tally: str = "",
    ) -> tuple[bool, str | None]:
        """Unfenced compare-and-set of one run record, in one round trip.

        Run records (the run ledger) are written by workers, which hold no
        term, so no term fences them: the write succeeds when the stored record
        of ``key`` is exactly ``expected`` (``None``: none, or an expired one),
        atomically with the comparison, and the record then expires ``ttl``
        seconds later by the store's clock. Returns whether it succeeded and
        the record stored now (``None`` when there is none, or, after a lost
        write, when the store cannot tell without another round trip).
        Run records live apart from :meth:`load_state`'s records.

        For a record of an entry: ``tally`` is the label its entry's summary
        counts it under (:meth:`run_summaries`; ``""``: counted under none), and
        with ``keep`` > 0 the entry keeps only its ``keep`` most recently
        created records (rewriting a record does not move it: slots are
        created in their order). A write removes at most :data:`RUNS_DROPPED` expired or
        excess records, so expiry costs what expired, never a scan.
        """

    @abstractmethod
    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        """The unexpired records of ``entry``, at most ``limit`` of them, most
        recently created first: (key, record) pairs, read in bounded pages."""

    @abstractmethod
    def run_summaries(self, election: str) -> list[RunSummary]:
        """One :class:`RunSummary` per entry with unexpired records, read in
        bounded pages: the cost grows with the entries, not their records."""

    # -- schedule entries ---------------------------------------------------
    #
    # Entries of an election are records beside its fenced state that any
    # process may edit without a term (an operator's CLI, an admin view): the
    # leader only reads them. Every applied edit moves the election's entries
    # version, so a leader asks one cheap question per tick and re-reads the
    # entries only when it moved.

    @abstractmethod
    def entries_version(self, election: str) -> int:
        """A number that changes whenever an entry of ``election`` is edited (0: never)."""

    @abstractmethod
    def load_entries(self, election: str) -> tuple[int, dict[str, str]]:
        """The entries version and the entries of ``election`` (name -> value), as written.

        The version is read no later than the entries: a version that moves after
        the read makes the reader read again, never miss an edit.
        """

    def entries_changed_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        """The entries edited after ``version`` (name -> value, ``None``: removed),
        with the version that brings a reader to, in one round trip.

        ``None``: the store cannot tell (it keeps no record of edits, or not
        that far back); read every entry with :meth:`load_entries`. A reader of
        a large schedule pays this way for an edit what the edit touched.
        """
        return None

    @abstractmethod
    def edit_entries(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        """Apply ``edits`` (compare-and-set, no term needed); one result each.

        The entries version moves when any of them applied.
        """
