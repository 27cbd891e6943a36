"""The overlap guard: one running slot per schedule entry, across every worker.

An entry with ``overlap`` = ``"skip"`` or ``"wait"`` keeps a mark in the run
ledger, ``@entry/<name>``: the slot running now, its worker and liveness. A
slot takes the mark with a compare-and-set when it is free: never taken, its
slot finished, or its liveness lapsed (the worker died mid-run, so a dead
worker's run stops blocking one ttl after its last renewal). Otherwise
``skip`` gives up at once and ``wait`` looks again every renew interval, up
to ``leader_overlap_wait`` seconds.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..backends import Backend
from ..exceptions import StoreUnavailable


def entry_key(entry: str) -> str:
    """The ledger key of ``entry``'s overlap mark."""
    return f"@entry/{entry}"


@dataclass
class Held:
    """A mark this process holds: its key and the text stored."""

    key: str
    slot: str
    stored: str


class EntryMarks:
    """The overlap marks of one worker process."""

    def __init__(
        self,
        backend: Backend,
        election: str,
        instance_id: str,
        ttl: float,
        renew_interval: float,
        retention: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.election = election
        self.instance_id = instance_id
        self.ttl = ttl
        self.renew_interval = renew_interval
        self.retention = retention
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}  # by slot

    def take(self, entry: str, slot: str, overlap: str, wait: float) -> str | None:
        """Take ``entry``'s mark for ``slot``; ``None`` when taken, else the slot
        that holds it (after ``wait`` seconds with ``overlap = "wait"``)."""
        key = entry_key(entry)
        deadline = self._clock() + (wait if overlap == "wait" else 0.0)
        expected: str | None = None
        while True:
            mine = self._mark(slot, self._clock() + self.ttl)
            won, stored = self.backend.put_run(self.election, key, expected, mine, self.retention)
            if won:
                with self._lock:
                    self._held[slot] = Held(key, slot, mine)
                return None
            holder = _parse(stored)
            now = self._clock()
            if stored is None or holder is None or holder.get("slot") == slot or _free(holder, now):
                expected = stored  # free (or ours from an earlier attempt): take it over
                continue
            if now >= deadline:
                return str(holder.get("slot"))
            time.sleep(min(self.renew_interval, max(0.0, deadline - now)))
            expected = None  # read again: a failed set-if-absent returns what is stored

    def renew(self, slot: str) -> None:
        """Push the liveness of ``slot``'s mark one ttl ahead (no-op without one)."""
        with self._lock:
            held = self._held.get(slot)
        if held is None:
            return
        renewed = self._mark(slot, self._clock() + self.ttl)
        try:
            won, _ = self.backend.put_run(
                self.election, held.key, held.stored, renewed, self.retention
            )
        except StoreUnavailable:
            return  # the next renewal tries again; a lapse only lets the next slot start
        if won:
            held.stored = renewed

    def release(self, slot: str) -> None:
        """``slot`` ended: free its entry's mark."""
        with self._lock:
            held = self._held.pop(slot, None)
        if held is None:
            return
        done = json.dumps({"slot": slot, "finished": self._clock()}, sort_keys=True)
        try:
            self.backend.put_run(self.election, held.key, held.stored, done, self.retention)
        except StoreUnavailable:
            pass  # the mark frees itself when its liveness lapses, one ttl from now

    def _mark(self, slot: str, alive_until: float) -> str:
        return json.dumps(
            {
                "slot": slot,
                "worker": self.instance_id,
                "pid": os.getpid(),
                "alive_until": alive_until,
            },
            sort_keys=True,
        )


def _parse(text: str | None) -> dict[str, object] | None:
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _free(mark: dict[str, object], now: float) -> bool:
    alive_until = mark.get("alive_until")
    if "finished" in mark or not isinstance(alive_until, (int, float)):
        return True
    return now >= alive_until
