"""One :class:`~celery_leader.Lease` in a process of its own, observable from a test.

Run as a script (the test suite spawns it; see ``tests/apps/lease_cluster.py``)::

    python tests/apps/lease_proc.py --url redis://... --id a --events a.jsonl \
        --slots slots.bin --slot 0 --ttl 2 --renew 0.667

What it records, all times ``time.monotonic()`` (CLOCK_MONOTONIC, system-wide on
Linux, so comparable across processes):

* ``--events``: one JSON object per line, appended with a single ``write`` each
  (``start``, ``acquired``, ``renewed``, ``lost``, ``follow``, ``store_error``,
  ``release``, ``elected``, ``demoted``, ``disconnected``, ``sigcont``, ``status``, ``sigterm``,
  ``stopped``, ``mem``).
* ``--slots``/``--slot``: a fixed-size record in a shared file that the test
  maps, with the epoch, start, belief deadline and end of the current term.

How the belief interval is made honest: the lease takes ``sent = monotonic()``
and then calls the backend; the wrapper below takes its own ``sent`` after that
(so never earlier) and, only once the store has acknowledged, records
``bound = sent + ttl * (1 - DRIFT) - MARGIN`` *before* returning to the lease.
The lease can extend its belief only after that return, and only up to its own
``sent + validity``, so ``bound`` is an upper bound on ``Lease.valid_until``
that is on record before the belief it covers begins, even if the process is
SIGSTOPped or SIGKILLed right after. ``start`` is taken when the acquire
returns, before the lease can believe; ``end`` is written when the lease calls
``release`` (it zeroes its belief before that). A term's belief is therefore
contained in ``[start, min(bound, end))``, which is what the tests check for
overlaps. For a SIGSTOPped process the record keeps its ``bound``: the belief
of a paused process ends at its deadline, which is what ``is_leader()`` computes.

Signals: SIGTERM calls ``lease.stop()`` (graceful hand-over) and exits;
SIGCONT records ``is_leader()`` as seen from inside right after a pause;
SIGUSR1 records a status line; SIGUSR2 starts, then ends, a tracemalloc window
(with ``--tracemalloc``).
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import select
import signal
import struct
import sys
import threading
import time
import tracemalloc
import zlib
from collections.abc import Sequence
from typing import Any

SLOT_SIZE = 64
_RECORD = struct.Struct("<qddd")  # epoch, start, bound, end
_CRC = struct.Struct("<I")
INF = math.inf


def pack_slot(epoch: int, start: float, bound: float, end: float) -> bytes:
    body = _RECORD.pack(epoch, start, bound, end)
    return body + _CRC.pack(zlib.crc32(body))


def read_slot(buf: Any, slot: int) -> tuple[int, float, float, float] | None:
    """``(epoch, start, bound, end)`` of ``slot``; ``None`` while it is empty.

    A record is written with one slice assignment; a reader that races a writer
    may see a torn record, which the CRC catches, and then reads again.
    """
    offset = slot * SLOT_SIZE
    size = _RECORD.size + _CRC.size
    for _ in range(10_000):
        raw = bytes(buf[offset : offset + size])
        body, crc = raw[: _RECORD.size], _CRC.unpack(raw[_RECORD.size :])[0]
        if crc == zlib.crc32(body):
            epoch, start, bound, end = _RECORD.unpack(body)
            return None if epoch == 0 else (epoch, start, bound, end)
        if raw == bytes(size):
            return None
    raise RuntimeError(f"slot {slot} stays torn: its writer stopped in mid-write")


class Recorder:
    """Event log and shared slot of this process."""

    def __init__(self, events_path: str, slots_path: str | None, slot: int, ident: str) -> None:
        self._fd = os.open(events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._ident = ident
        self._slot = slot
        self._mm: mmap.mmap | None = None
        if slots_path:
            with open(slots_path, "r+b") as f:
                self._mm = mmap.mmap(f.fileno(), 0)
        self._lock = threading.Lock()
        self.term: dict[str, Any] = {}

    def emit(self, ev: str, **fields: Any) -> None:
        record = {"ev": ev, "id": self._ident, "pid": os.getpid(), "t": time.monotonic(), **fields}
        os.write(self._fd, (json.dumps(record) + "\n").encode())

    def slot(self, epoch: int, start: float, bound: float, end: float) -> None:
        if self._mm is not None:
            offset = self._slot * SLOT_SIZE
            data = pack_slot(epoch, start, bound, end)
            self._mm[offset : offset + len(data)] = data


def _recording_lock(inner: Any, rec: Recorder, validity: float) -> Any:
    from celery_leader.backends import LeaseLock, Renewal
    from celery_leader.exceptions import StoreUnavailable

    class RecordingLock(LeaseLock):
        """Delegates to the real lock; records acknowledged terms before the lease sees them."""

        def __init__(self) -> None:
            self.url, self.timeout = inner.url, inner.timeout
            self.holdoff = inner.holdoff

        def _error(self, op: str, exc: Exception) -> None:
            rec.emit("store_error", op=op, error=str(exc)[:200])

        def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Any:
            sent = time.monotonic()
            try:
                result = inner.acquire(election, instance_id, ttl, min_epoch)
            except StoreUnavailable as exc:
                self._error("acquire", exc)
                raise
            if result.term is not None:
                start = time.monotonic()
                bound = sent + validity
                epoch = result.term.epoch
                with rec._lock:
                    rec.term = {"epoch": epoch, "start": start}
                rec.emit(
                    "acquired",
                    epoch=epoch,
                    sent=sent,
                    start=start,
                    bound=bound,
                    min_epoch=min_epoch,
                )
                rec.slot(epoch, start, bound, INF)
            else:
                holder = result.holder
                rec.emit(
                    "follow",
                    holder_epoch=None if holder is None else holder.epoch,
                    holder_id=None if holder is None else holder.instance_id,
                    retry_after=result.retry_after,
                    min_epoch=min_epoch,
                )
            return result

        def renew(self, election: str, term: Any, ttl: float) -> Any:
            sent = time.monotonic()
            try:
                result, store_time = inner.renew(election, term, ttl)
            except StoreUnavailable as exc:
                self._error("renew", exc)
                raise
            if result is Renewal.LOST:
                rec.emit("lost", epoch=term.epoch)
            else:
                bound = sent + validity
                start = (
                    rec.term.get("start", sent) if rec.term.get("epoch") == term.epoch else sent
                )
                rec.emit("renewed", epoch=term.epoch, bound=bound, result=result.value)
                rec.slot(term.epoch, start, bound, INF)
            return result, store_time

        def release(self, election: str, term: Any) -> None:
            if term is None:
                inner.release(election, None)
                return
            now = time.monotonic()
            rec.emit("release", epoch=term.epoch, end=now)
            if rec.term.get("epoch") == term.epoch:
                rec.slot(term.epoch, rec.term["start"], now, now)
            try:
                inner.release(election, term)
            except StoreUnavailable as exc:
                self._error("release", exc)
                raise

        def wait(
            self, election: str, timeout: float, cancel: threading.Event, term: Any = None
        ) -> bool:
            held = bool(inner.wait(election, timeout, cancel, term))
            if term is not None and not held:
                rec.emit("disconnected", epoch=term.epoch)
            return held

        def holders(self, elections: Sequence[str] | None = None) -> dict[str, Any]:
            return dict(inner.holders(elections))

        def request_resign(self, election: str) -> Any:
            return inner.request_resign(election)

    return RecordingLock()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--election", default="chaos")
    parser.add_argument("--prefix", default="celery_leader")
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--renew", type=float, default=None)
    parser.add_argument("--slots", default=None)
    parser.add_argument("--slot", type=int, default=0)
    parser.add_argument("--tracemalloc", action="store_true")
    args = parser.parse_args(argv)

    # Everything the lease will run is imported first, so that tracemalloc (when
    # asked for) sees what the lease holds, not module code.
    import celery_leader.backends.file
    import celery_leader.backends.memory
    import celery_leader.backends.redis  # noqa: F401
    from celery_leader import LeaderConfig, Lease
    from celery_leader.backends import open_store
    from celery_leader.callbacks import Callbacks
    from celery_leader.config import DRIFT, MARGIN

    rec = Recorder(args.events, args.slots, args.slot, args.id)
    settings: dict[str, Any] = {
        "leader_url": args.url,
        "leader_ttl": args.ttl,
        "leader_renew_interval": args.renew,
        "leader_key_prefix": args.prefix,
        "leader_instance_id": args.id,
    }
    config = LeaderConfig.from_mapping(settings)
    validity = config.ttl * (1 - DRIFT) - MARGIN

    if args.tracemalloc:
        tracemalloc.start(25)  # deep tracebacks, to tell module imports apart

    def on_elected(lease: Any) -> None:
        rec.emit("elected", epoch=lease.epoch, valid_until=lease.valid_until)

    def on_demoted(lease: Any) -> None:
        rec.emit("demoted", is_leader=lease.is_leader())

    lock = _recording_lock(open_store(config).lock, rec, validity)
    lease = Lease.from_config(
        args.election,
        config,
        lock,
        callbacks=Callbacks(on_started=on_elected, on_stopped=on_demoted),
    )

    # Handlers run in the main thread; the wakeup fd makes its select() return at
    # once whichever thread the kernel delivered the signal to.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    mem_window: dict[str, Any] = {}

    def status(kind: str) -> None:
        now = time.monotonic()
        rec.emit(
            kind,
            is_leader=lease.is_leader(),
            valid_until=lease.valid_until,
            now=now,
            epoch=lease.epoch,
        )

    def on_term(signum: int, frame: Any) -> None:
        rec.emit("sigterm")
        lease.stop()
        rec.emit("stopped", is_leader=lease.is_leader())
        os._exit(0)

    def on_usr2(signum: int, frame: Any) -> None:
        if not tracemalloc.is_tracing():
            rec.emit("mem_error", error="not started with --tracemalloc")
            return
        current, _ = tracemalloc.get_traced_memory()
        if not mem_window:
            tracemalloc.reset_peak()
            mem_window.update(current=current, threads=threading.active_count(), fds=_open_fds())
            rec.emit("mem_begin", current=current)
            return
        _, peak = tracemalloc.get_traced_memory()
        # What the lease holds, without the code and tables of modules that redis-py
        # and the standard library import lazily on the first connection.
        imports = [
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>", all_frames=True),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>", all_frames=True),
        ]
        snapshot = tracemalloc.take_snapshot().filter_traces(imports)
        without_imports = sum(stat.size for stat in snapshot.statistics("filename"))
        rec.emit(
            "mem",
            begin=mem_window["current"],
            end=current,
            without_imports=without_imports,
            peak=peak,
            threads_begin=mem_window["threads"],
            threads_end=threading.active_count(),
            fds_begin=mem_window["fds"],
            fds_end=_open_fds(),
            is_leader=lease.is_leader(),
        )
        mem_window.clear()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGCONT, lambda s, f: status("sigcont"))
    signal.signal(signal.SIGUSR1, lambda s, f: status("status"))
    signal.signal(signal.SIGUSR2, on_usr2)

    rec.emit("start", url=config.display_url, ttl=config.ttl, renew=config.renew_interval)
    lease.start()
    while True:
        ready, _, _ = select.select([wake_r], [], [], 5.0)
        if ready:
            os.read(wake_r, 512)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
