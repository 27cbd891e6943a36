"""A tap on a Dramatiq Redis broker queue: takes each message off as it lands and notes when.

Used by the Dramatiq chaos tests and the Dramatiq benchmark, where nothing else
consumes the queue: duplicates are then counted from what the broker received,
and a gap is a silence a worker would have seen.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis


@dataclass(frozen=True)
class Arrival:
    seen: float  # time.monotonic() when the tap took it off the broker
    options: dict[str, Any]  # the message's options (leader_slot, leader_epoch, ...)


class DramatiqTap:
    """Pops every message of ``queue`` (polling every 5 ms) in a thread of its own."""

    def __init__(self, client: redis.Redis, queue: str = "ticks", namespace: str = "dramatiq"):
        self._client = client
        self._key = f"{namespace}:{queue}"
        self._lock = threading.Lock()
        self._seen: list[Arrival] = []
        self._failure: Exception | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dramatiq-tap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                ids = self._client.lpop(self._key, 1000)
            except redis.ConnectionError as exc:  # the broker is down: note it, keep trying
                self._failure = exc
                self._stopping.wait(0.1)
                continue
            self._failure = None
            seen = time.monotonic()
            if not ids:
                self._stopping.wait(0.005)
                continue
            raws = self._client.hmget(f"{self._key}.msgs", ids)
            self._client.hdel(f"{self._key}.msgs", *ids)
            batch = [Arrival(seen, json.loads(raw)["options"]) for raw in raws if raw]
            with self._lock:
                self._seen.extend(batch)

    def arrivals(self) -> list[Arrival]:
        """Everything taken off so far, oldest first."""
        with self._lock:
            return list(self._seen)

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
