"""The term history: one record per term in the store's journal, for operators.

The holder writes its term's record when it is announced, and completes it
after it released the term; a term that ended without its holder saying so (a
crash, a cut-off leader) is completed by the next holder as ``"lost"``. The
history is read by people (the console's timeline), never to decide who leads:
its writes happen off the elector's loop, and a failed one is logged and lost.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..backends import Journal, JournalWrite
from ..exceptions import StoreUnavailable
from .events import Events, LeaseArg

logger = logging.getLogger(__name__)

#: The journal log of the term history.
TERMS = "terms"
#: Terms kept per election: two hundred hand-overs, a year of weekly deploys
#: with room for crashes, in a few tens of kilobytes.
TERMS_KEPT = 200


def term_key(epoch: int) -> str:
    """The journal key of a term: its epoch, fixed width so keys sort as epochs do."""
    return f"{epoch:020d}"


@dataclass(frozen=True)
class TermRecord:
    """One term: its epoch, holder, start and end (wall-clock seconds, by the
    store's clock where it has one) and how it ended.

    ``how`` is ``None`` while the term lasts; then the holder's reason for
    stepping down (``"stopping"``: it left the election; ``"resigned"``,
    ``"expired"``, ``"disconnected"``, ``"stepped_down"``), or ``"lost"`` when
    the next holder found it never completed (``ended`` is then ``None``).
    """

    epoch: int
    holder: str
    started: float
    ended: float | None = None
    how: str | None = None

    def dump(self) -> str:
        """The record as the journal keeps it (JSON)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def load(cls, text: str) -> TermRecord | None:
        """The record ``text`` holds; ``None`` for one this version cannot read."""
        try:
            data = json.loads(text)
            return cls(
                int(data["epoch"]),
                str(data["holder"]),
                float(data["started"]),
                None if data.get("ended") is None else float(data["ended"]),
                None if data.get("how") is None else str(data["how"]),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def term_history(
    journal: Journal, election: str, limit: int, before: int | None = None
) -> list[TermRecord]:
    """Up to ``limit`` terms of ``election`` older than epoch ``before`` (all when
    ``None``), newest first (one round trip)."""
    pairs = journal.read(election, TERMS, limit, None if before is None else term_key(before))
    return [record for _, text in pairs if (record := TermRecord.load(text)) is not None]


class TermHistory(Events):
    """Writes a lease's terms into the journal, on a thread of its own.

    A store slow enough to delay these writes would otherwise delay the renewal
    that follows an election; so the elector only queues them, and waits for
    its writer (one store deadline at most) only after a release, when the
    term's end is all that is left to record before the process may exit.
    """

    def __init__(self, journal: Journal, timeout: float, wall: Callable[[], float]) -> None:
        self._journal = journal
        self._timeout = timeout
        self._wall = wall
        self._term: TermRecord | None = None
        self._queue: queue.Queue[Callable[[], Any]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()  # one writer thread: writes stay in order
        self._failing = False

    def on_transition(self, lease: LeaseArg, event: str, epoch: int) -> None:
        if event != "elected":
            return
        term = self._term = TermRecord(epoch, lease.instance_id, self._wall())
        self._submit(lambda: self._elected(lease.election, term))

    def on_released(self, lease: LeaseArg, epoch: int, how: str) -> None:
        term, self._term = self._term, None
        if term is None or term.epoch != epoch:
            return
        ended = replace(term, ended=self._wall(), how=how)
        done = threading.Event()
        self._submit(lambda: self._write(lease.election, ended), done.set)
        done.wait(2 * self._timeout)  # the start's write may still be queued ahead

    def _elected(self, election: str, term: TermRecord) -> None:
        writes = [term]
        previous = term_history(self._journal, election, 1, before=term.epoch)
        if previous and previous[0].how is None:
            writes.insert(0, replace(previous[0], how="lost"))
        self._write(election, *writes)

    def _write(self, election: str, *terms: TermRecord) -> None:
        self._journal.write(
            election,
            [JournalWrite(TERMS, term_key(t.epoch), t.dump(), TERMS_KEPT) for t in terms],
        )

    def _submit(self, job: Callable[[], Any], then: Callable[[], Any] | None = None) -> None:
        def task() -> None:
            self._run(job)
            if then is not None:
                then()

        self._queue.put(task)
        with self._starting:
            if self._thread is None or not self._thread.is_alive():
                # Daemon: a process that exits mid-write leaves its term to the next
                # holder, which records it as lost; it must never hang an exit.
                self._thread = threading.Thread(target=self._drain, daemon=True)
                self._thread.name = "term-history"
                self._thread.start()

    def _drain(self) -> None:
        while True:
            self._queue.get()()

    def _run(self, job: Callable[[], Any]) -> None:
        try:
            job()
        except StoreUnavailable as exc:
            if not self._failing:
                logger.warning("celery-leader: could not record the term history: %s", exc)
            self._failing = True
        except Exception:
            logger.exception("celery-leader: could not record the term history")
        else:
            self._failing = False
