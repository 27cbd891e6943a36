"""The deadline table that carries leadership from a worker to its pool processes."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import signal
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_leader.celery import deadline_table
from celery_leader.celery.deadline_table import DeadlineTable

SPAWN = multiprocessing.get_context("spawn")
FORK = multiprocessing.get_context("fork")


@pytest.fixture
def table() -> Iterator[DeadlineTable]:
    table = DeadlineTable.create("store", ["beat", "worker"])
    yield table
    table.remove()


def test_new_slots_say_not_leading(table: DeadlineTable) -> None:
    assert table.read(0) == (0.0, 0)
    assert not table.checker(0)()
    assert table.index("worker") == 1
    assert table.index("other") is None


def test_deadline_decides(table: DeadlineTable) -> None:
    table.write("worker", time.monotonic() + 60, 7)
    assert table.checker(1)()
    assert table.read(1)[1] == 7
    table.write("worker", time.monotonic() - 0.001, 7)
    assert not table.checker(1)()


def test_file_is_private_and_removed(table: DeadlineTable) -> None:
    assert table.path.stat().st_mode & 0o777 == 0o600
    table.remove()
    assert not table.path.exists()
    table.write("beat", 1.0, 1)  # the mapping stays usable for those who have it
    assert table.read(0) == (1.0, 1)


def _read_in_child(path: str, index: int, out: multiprocessing.SimpleQueue) -> None:  # type: ignore[type-arg]
    table = DeadlineTable.open(path)
    out.put((table.store, table.names, table.read(index), table.checker(index)()))


def test_a_spawned_process_reads_by_path(table: DeadlineTable) -> None:
    deadline = time.monotonic() + 60
    table.write("worker", deadline, 3)
    out = SPAWN.SimpleQueue()
    child = SPAWN.Process(target=_read_in_child, args=(str(table.path), 1, out))
    child.start()
    child.join(30)
    # CLOCK_MONOTONIC is machine-wide: the child agrees the deadline is ahead.
    assert out.get() == ("store", ["beat", "worker"], (deadline, 3), True)


def _check_pairs(path: str, seconds: float, out: multiprocessing.SimpleQueue) -> None:  # type: ignore[type-arg]
    table = DeadlineTable.open(path)
    reads = torn = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        valid_until, epoch = table.read(0)
        reads += 1
        torn += valid_until != float(epoch)
    out.put((reads, torn))


def test_readers_never_see_a_torn_pair(table: DeadlineTable) -> None:
    out = SPAWN.SimpleQueue()
    child = SPAWN.Process(target=_check_pairs, args=(str(table.path), 1.0, out))
    child.start()
    n = 0
    while child.is_alive():
        n += 1
        table.write("beat", float(n), n)  # every consistent pair has value == epoch
    child.join()
    reads, torn = out.get()
    assert n > 100, "the writer hardly ran while the reader read"
    assert reads > 100
    assert torn == 0, f"{torn} torn pairs in {reads} reads"


def _slot_words(table: DeadlineTable, index: int) -> memoryview:
    """Slot ``index`` of the table file as int64 words, at the documented layout."""
    with open(table.path, "r+b") as f:
        buf = mmap.mmap(f.fileno(), 0)
    header_len = struct.unpack_from("<I", buf, 16)[0]
    slots_at = (24 + header_len + 63) // 64 * 64
    return memoryview(buf)[slots_at + 32 * index : slots_at + 32 * (index + 1)].cast("q")


def test_a_writer_stopped_mid_write(table: DeadlineTable) -> None:
    deadline = time.monotonic() + 60
    table.write("worker", deadline, 1)
    words = _slot_words(table, 1)
    words[0] += 1  # the odd sequence number SIGSTOP mid-publish leaves
    # No consistent pair to be had; the deadline word alone is never torn.
    assert table.read(1) == (0.0, 0)
    assert table.checker(1)()
    words.cast("B").cast("d")[1] = 0.0
    assert not table.checker(1)()


def test_the_epoch_of_a_leading_slot_waits_for_a_write_in_progress(
    table: DeadlineTable,
) -> None:
    """``@leader_only`` decides by the epoch: a writer descheduled half-way through
    a renewal (seq odd for a while) must not make a leading pool answer "not
    leading" (its task forwarded, retried or skipped), as the deadline word says
    it leads."""
    table.write("worker", time.monotonic() + 60, 5)
    words = _slot_words(table, 1)
    words[0] += 1  # the writer is half-way through its next write ...

    def finish() -> None:
        words[0] += 1  # ... and finishes it once it runs again

    writer = threading.Timer(0.05, finish)
    writer.start()
    try:
        assert table.epoch_reader(1)() == 5
    finally:
        writer.join()


def test_the_epoch_of_a_slot_whose_writer_stopped_half_way_ends_with_its_deadline(
    table: DeadlineTable,
) -> None:
    deadline = time.monotonic() + 0.2
    table.write("worker", deadline, 5)
    words = _slot_words(table, 1)
    words[0] += 1  # the odd sequence number SIGSTOP mid-publish leaves, for good
    assert table.epoch_reader(1)() is None
    assert time.monotonic() >= deadline


def _create_and_wait(out: multiprocessing.SimpleQueue) -> None:  # type: ignore[type-arg]
    table = DeadlineTable.create("store", ["worker"])
    out.put(str(table.path))
    time.sleep(60)


def test_tables_of_killed_owners_are_swept(table: DeadlineTable) -> None:
    out = SPAWN.SimpleQueue()
    child = SPAWN.Process(target=_create_and_wait, args=(out,))
    child.start()
    orphan = Path(out.get())
    assert orphan.exists()
    DeadlineTable.create("store", ["x"]).remove()
    assert orphan.exists(), "a live owner's table was swept"
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join()
    DeadlineTable.create("store", ["x"]).remove()
    assert not orphan.exists()
    assert table.path.exists()


def _trust(out: multiprocessing.SimpleQueue, depth: int) -> None:  # type: ignore[type-arg]
    if depth:
        grandchild = FORK.Process(target=_trust, args=(out, depth - 1))
        grandchild.start()
        grandchild.join()
        return
    table = deadline_table.process_table()
    out.put(None if table is None else table.names)


@pytest.mark.parametrize("context", [FORK, SPAWN], ids=["fork", "spawn"])
def test_only_the_owner_and_its_children_trust_the_table(
    table: DeadlineTable, context: multiprocessing.context.BaseContext
) -> None:
    deadline_table.set_process_table(table)
    try:
        assert deadline_table.process_table() is table
        assert os.environ[deadline_table.ENV_VAR] == str(table.path)
        out = context.SimpleQueue()
        for depth, expected in ((0, ["beat", "worker"]), (1, None)):
            child = context.Process(target=_trust, args=(out, depth))  # type: ignore[attr-defined]
            child.start()
            child.join(30)
            assert out.get() == expected
    finally:
        deadline_table.set_process_table(None)
    assert deadline_table.ENV_VAR not in os.environ
    assert deadline_table.process_table() is None


def test_open_refuses_other_files(tmp_path: Path) -> None:
    path = tmp_path / "x.table"
    path.write_bytes(b"something else entirely, long enough for a header")
    with pytest.raises(ValueError, match="not a celery-leader table"):
        DeadlineTable.open(path)
