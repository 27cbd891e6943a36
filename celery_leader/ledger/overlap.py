"""The overlap guard: one running slot per schedule entry, across every worker.

The entry's mark ``@entry/<name>`` names the slot running now; a slot takes it with a
compare-and-set when it is free (never taken, its slot finished, or its liveness
lapsed: a dead worker blocks one ttl at most). ``skip`` gives up at once, ``wait``
looks again every renew interval up to ``leader_overlap_wait``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

from ..exceptions import StoreUnavailable
from .target import LedgerTarget


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

    def __init__(self, target: LedgerTarget) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}  # by slot

    def take(self, entry: str, slot: str, overlap: str, wait: float) -> str | None:
        """Take ``entry``'s mark for ``slot``; ``None`` when taken, else the slot
        that holds it (after ``wait`` seconds with ``overlap = "wait"``)."""
        key = entry_key(entry)
        deadline = self.target.clock() + (wait if overlap == "wait" else 0.0)
        expected: str | None = None
        while True:
            mine = self._mark(slot)
            won, stored = self.target.put(key, expected, mine)
            if won:
                with self._lock:
                    self._held[slot] = Held(key, slot, mine)
                return None
            holder = _parse(stored)
            now = self.target.clock()
            if stored is None or holder is None or holder.get("slot") == slot or _free(holder, now):
                expected = stored  # free (or ours from an earlier attempt): take it over
                continue
            if now >= deadline:
                return str(holder.get("slot"))
            time.sleep(min(self.target.renew_interval, max(0.0, deadline - now)))
            expected = None  # read again: a failed set-if-absent returns what is stored

    def renew(self, slot: str) -> None:
        """Push the liveness of ``slot``'s mark one ttl ahead (no-op without one)."""
        with self._lock:
            held = self._held.get(slot)
        if held is None:
            return
        renewed = self._mark(slot)
        try:
            won, _ = self.target.put(held.key, held.stored, renewed)
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
        done = json.dumps({"slot": slot, "finished": self.target.clock()}, sort_keys=True)
        try:
            self.target.put(held.key, held.stored, done)
        except StoreUnavailable:
            pass  # the mark frees itself when its liveness lapses, one ttl from now

    def _mark(self, slot: str) -> str:
        """The mark of ``slot`` held here, alive one ttl from now."""
        target = self.target
        mark = {"slot": slot, "worker": target.instance_id, "pid": os.getpid()}
        return json.dumps({**mark, "alive_until": target.clock() + target.ttl}, sort_keys=True)


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
