"""The ``file:///dir`` store: flock hand-over in real processes, and its edge cases.

Same observation machinery as the Redis tests (see tests/apps/lease_cluster.py).
Run with ``-s`` to see the measured numbers.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from celery_leader import Lease
from celery_leader.backends import (
    Edit,
    Fence,
    JournalWrite,
    LeaseLock,
    Renewal,
    StoreFacets,
    StoreParams,
    Write,
)
from celery_leader.backends import file as file_store
from celery_leader.backends.file import open_store
from celery_leader.election.events import Callbacks
from celery_leader.exceptions import StoreUnavailable
from harness.procs import Procs
from harness.procs import signal as send_signal
from harness.waiting import wait_for
from tests.apps.lease_cluster import LeaseCluster, Member, describe_memory, run_chaos, stats

TTL = 2.0
RENEW = TTL / 3
STARTUP = 20.0
ELECTION = "chaos"
PREFIX = "celery_leader"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "leases"
    path.mkdir()
    return path


@pytest.fixture
def cluster(procs: Procs, tmp_path: Path, store: Path):
    made = LeaseCluster(procs, tmp_path, f"file://{store}", ttl=TTL, renew=RENEW, settle_follows=1)
    yield made
    made.close()


def opened(store: Path, timeout: float, prefix: str = PREFIX) -> StoreFacets:
    """The file store in ``store``, as ``leader_url=file://<store>`` opens it."""
    return open_store(StoreParams(f"file://{store}", prefix, timeout))


def start_pair(cluster: LeaseCluster) -> tuple[Member, Member]:
    a = cluster.spawn(0)
    assert cluster.wait_leader(STARTUP) is a
    b = cluster.spawn(1)
    cluster.wait_settled(b, 0.0, STARTUP)
    return a, b


def exited_cleanly(member: Member) -> None:
    assert member.proc.wait(timeout=10) == 0


# -- hand-over -------------------------------------------------------------------------


@pytest.mark.timing  # hand-overs within 0.5 s
def test_sigkill_of_the_holder_hands_over_at_once(cluster: LeaseCluster) -> None:
    leader, _ = start_pair(cluster)
    cluster.wait_settled(cluster.spawn(2), 0.0, STARTUP)
    with cluster.sampling() as samples:
        handovers = cluster.hand_overs(leader, cluster.kill, 5, 3, STARTUP)
    print(f"\nHANDOVER file SIGKILL: {stats(handovers)}")
    assert max(handovers) <= 0.5
    assert not samples.several()
    cluster.check_terms()


@pytest.mark.timing  # hand-overs within 0.5 s
def test_graceful_stop_hands_over_within_half_a_second(cluster: LeaseCluster) -> None:
    leader, _ = start_pair(cluster)
    with cluster.sampling() as samples:
        handovers = cluster.hand_overs(leader, cluster.terminate, 3, 3, STARTUP, exited_cleanly)
    print(f"\nHANDOVER file graceful stop(): {stats(handovers)}")
    assert max(handovers) <= 0.5
    assert not samples.several()
    cluster.check_terms()


@pytest.mark.timing  # hand-overs within 0.5 s
@pytest.mark.slow
def test_three_processes_exactly_one_leads(cluster: LeaseCluster) -> None:
    limits = {"kill": 0.5, "term": 0.5}
    result = run_chaos(
        cluster,
        size=3,
        duration=8.0,
        faults=["kill", "term", "kill_follower"],
        handover_limits=limits,
    )
    print(f"\nCHAOS file 3 processes: {result.summary()}")
    assert not result.samples.several()
    assert not result.no_leader_unexplained, result.no_leader_unexplained[:5]
    for kind, limit in limits.items():
        assert result.handovers(kind) and max(result.handovers(kind)) <= limit


@pytest.mark.timing  # a hand-over within 0.5 s of SIGCONT
def test_sigstop_holder_keeps_the_lock_then_steps_down_at_sigcont(cluster: LeaseCluster) -> None:
    """A paused holder keeps its flock (the file store is only as live as its holder),
    but its belief ends at its deadline; after SIGCONT it says so and hands over."""
    a, b = start_pair(cluster)
    with cluster.sampling() as samples:
        paused = cluster.pause(a)
        time.sleep(TTL + 0.3)  # the pause: well past the ttl
        assert cluster.first_term_after(paused) is None, "nobody can take a held flock"
        resumed = cluster.resume(a)
        seen = a.wait_event("sigcont", 2, after=resumed)
        demoted = a.wait_event("demoted", 2, after=resumed)
        b_term = cluster.wait_term_after(resumed, 2, other_than=a)
        rejoined = a.wait_event("follow", RENEW + 2, after=demoted["t"], holder_id=b.ident)
    a_term = [t for t in cluster.terms() if t.member is a and t.start < paused][-1]
    print(
        f"\nSIGSTOP file: a's belief ended {a_term.end - paused:.3f} s into the pause; "
        f"b led {(b_term.start - resumed) * 1000:.1f} ms after SIGCONT"
    )
    assert seen["is_leader"] is False
    # Either the deadline had passed, or the lease thread (which woke up too) had
    # already stepped down and zeroed it.
    assert seen["valid_until"] == 0 or seen["now"] >= seen["valid_until"]
    assert a_term.end <= paused + TTL
    none_while_paused = [who for t, who in samples.snapshot() if a_term.end <= t < resumed]
    assert none_while_paused and not any(none_while_paused)
    assert b_term.member is b and b_term.start - resumed <= 0.5
    assert rejoined["holder_epoch"] == b_term.epoch
    assert not samples.several()
    cluster.check_terms()


@pytest.mark.timing  # the kernel's flock within 0.1 s
def test_blocked_follower_takes_the_kernel_lock_at_once(procs: Procs, store: Path) -> None:
    """A holder process dies; the kernel gives its flock to the follower's waiting thread."""
    lock = store / f"{PREFIX}.{ELECTION}.lock"
    holder = procs.spawn_python(
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n",
        str(lock),
    )
    holder.wait_for_line("^locked$", STARTUP)
    backend = opened(store, 1.0).lock
    assert backend.acquire(ELECTION, "me", TTL, 0).term is None
    woke: list[float] = []
    cancel = threading.Event()
    waiting = threading.Thread(
        target=lambda: (backend.wait(ELECTION, 30, cancel), woke.append(time.monotonic()))
    )
    waiting.start()
    wait_for(
        lambda: any(t.name == f"celery-leader-flock:{lock.name}" for t in threading.enumerate()),
        2,
    )
    # /proc/locks marks a request blocked behind a holder with "->".
    wait_for(lambda: "->" in Path("/proc/locks").read_text(), 2, message="flock not blocked")
    assert not woke
    killed = time.monotonic()
    send_signal(holder, signal.SIGKILL)
    wait_for(lambda: woke, 2, message="the follower did not get the lock")
    took = woke[0] - killed
    got = backend.acquire(ELECTION, "me", TTL, 0)
    print(f"\nFILE kernel lock to the blocked follower {took * 1000:.1f} ms after SIGKILL")
    assert took < 0.1
    assert got.term is not None and got.term.epoch == 1
    holder_info = backend.holder(ELECTION)
    assert holder_info is not None and holder_info.instance_id == "me"
    backend.release(ELECTION, got.term)
    assert backend.holder(ELECTION) is None
    cancel.set()
    waiting.join(5)


# -- the lock file is deleted under a holder ------------------------------------------------


def _lease(lock: LeaseLock, ident: str, **kwargs) -> Lease:
    return Lease(
        ELECTION,
        lock,
        ttl=1.0,
        renew_interval=0.3,
        instance_id=ident,
        **kwargs,
    )


@pytest.mark.timing  # lost within 0.1 s of its next renewal
def test_holder_whose_lock_file_was_deleted_loses(store: Path) -> None:
    demoted: list[float] = []
    stopped = Callbacks(on_stopped=lambda _: demoted.append(time.monotonic()))
    files = opened(store, 0.3)
    a = _lease(files.lock, "a", callbacks=stopped)
    a.start()
    try:
        wait_for(a.is_leader, 5)
        term = a.term
        assert term is not None
        deleted = time.monotonic()
        (store / f"{PREFIX}.{ELECTION}.lock").unlink()
        assert files.lock.renew(ELECTION, term, 1.0)[0] is Renewal.LOST
        wait_for(lambda: demoted, 0.3 + 0.3)
        assert demoted[0] - deleted <= 0.3 + 0.1, "lost at its next renewal"
        assert not a.is_leader() or a.epoch != term.epoch
    finally:
        a.stop()


def test_deleted_lock_file_never_gives_two_leaders(store: Path) -> None:
    a = _lease(opened(store, 0.3).lock, "a")
    c = _lease(opened(store, 0.3).lock, "c")
    a.start()
    try:
        wait_for(a.is_leader, 5)
        (store / f"{PREFIX}.{ELECTION}.lock").unlink()
        c.start()
        both = 0
        end = time.monotonic() + 0.3 + 0.2
        while time.monotonic() < end:
            both += a.is_leader() and c.is_leader()
            time.sleep(0.001)
        assert both == 0, f"{both} samples with two leaders"
    finally:
        a.stop()
        c.stop()


def test_follower_does_not_leak_threads_or_descriptors(store: Path) -> None:
    ttl, renew = 0.6, 0.2
    elections: list[str] = []
    a = Lease(
        ELECTION, opened(store, 0.1).lock, ttl=ttl, renew_interval=renew,
        instance_id="a", callbacks=Callbacks(on_started=lambda x: elections.append(x.instance_id)),
    )  # fmt: skip
    b = Lease(
        ELECTION, opened(store, 0.1).lock, ttl=ttl, renew_interval=renew,
        instance_id="b",
    )  # fmt: skip
    # Threads of earlier tests' leases may still be winding down: not this test's.
    earlier = set(threading.enumerate())
    a.start()
    try:
        wait_for(a.is_leader, 5)
        b.start()
        time.sleep(0.5)
        fds_before = len(os.listdir("/proc/self/fd"))
        time.sleep(6 * ttl)  # six of b's ttl-long waits
        flock_threads = [
            t
            for t in threading.enumerate()
            if t.name.startswith("celery-leader-flock") and t not in earlier
        ]
        fds_after = len(os.listdir("/proc/self/fd"))
        assert elections == ["a"], f"the leader changed meanwhile: {elections}"
        assert len(flock_threads) <= 1, f"{len(flock_threads)} flock threads"
        assert fds_after <= fds_before + 1, f"fds {fds_before} -> {fds_after}"
    finally:
        a.stop()
        b.stop()


# -- steady-state cost -------------------------------------------------------------------


def test_steady_state_memory(cluster: LeaseCluster) -> None:
    cluster.spawn(0, extra=["--tracemalloc"])
    leader = cluster.wait_leader(STARTUP)
    follower = cluster.spawn(1, extra=["--tracemalloc"])
    cluster.wait_settled(follower, 0.0, STARTUP)
    for member in (leader, follower):
        began = time.monotonic()
        send_signal(member.proc, signal.SIGUSR2)
        member.wait_event("mem_begin", 5, after=began)
    time.sleep(2 * TTL + 0.1)  # the observation window: two of the follower's waits
    for member in (leader, follower):
        send_signal(member.proc, signal.SIGUSR2)
    mem = {m.ident: m.wait_event("mem", 5) for m in (leader, follower)}
    print("\nSTEADY STATE file:")
    for ident, sample in mem.items():
        print(f"  {ident}: {describe_memory(sample)}")
    assert mem[leader.ident]["is_leader"] and not mem[follower.ident]["is_leader"]
    for sample in mem.values():
        assert sample["end"] < 512 * 1024, "well under 1 MB"
        assert sample["peak"] < 512 * 1024
        assert sample["without_imports"] < 256 * 1024
        assert sample["end"] - sample["begin"] < 32 * 1024


def test_file_system_errors_are_store_unavailable(store: Path) -> None:
    """release and request_resign raise StoreUnavailable naming the file, never OSError."""
    a = opened(store, 0.5).lock
    b = opened(store, 0.5).lock
    term = a.acquire(ELECTION, "a", TTL, 0).term
    assert term is not None
    resign = store / f"{PREFIX}.{ELECTION}.resign"
    (resign / "in-the-way").mkdir(parents=True)  # a directory where the file goes
    with pytest.raises(StoreUnavailable, match=f"{PREFIX}.{ELECTION}.resign"):
        b.request_resign(ELECTION)
    holder = store / f"{PREFIX}.{ELECTION}.holder"
    holder.unlink()
    (holder / "in-the-way").mkdir(parents=True)
    with pytest.raises(StoreUnavailable, match=f"{PREFIX}.{ELECTION}.holder"):
        a.release(ELECTION, term)
    fd = os.open(store / f"{PREFIX}.{ELECTION}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the flock went all the same
    finally:
        os.close(fd)


def test_an_entries_file_the_changes_file_does_not_reach_is_read_whole(tmp_path: Path) -> None:
    """The previous release (or an editor that died between the two files)
    rewrites the entries file alone: readers from before it read everything,
    and the next edit starts the changes over from there."""
    backend = opened(tmp_path, 1.0, "p").entries
    assert backend.edit("beat", [Edit("a", None, "a1")]) == [True]
    version, entries = backend.load("beat")
    # The previous release's edit: the entries file only.
    entries["b"] = "b1"
    path = tmp_path / "p.beat.entries"
    path.write_text(json.dumps({"version": version + 1, "entries": entries}))
    assert backend.version("beat") == version + 1, "read from the file's head"
    assert backend.changes_since("beat", version) is None
    assert backend.edit("beat", [Edit("a", "a1", None)]) == [True]
    assert backend.changes_since("beat", version) is None, "b would be missed"
    assert backend.changes_since("beat", version + 1) == (version + 2, {"a": None})


def test_a_reader_between_an_edits_two_files_asks_again_instead_of_reading_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edit writes the entries file, then the changes file, holding the entries lock: a
    reader in between is told "nothing yet" and gets the edit at its next ask. It used to
    read every entry again (a tight reader did so at 44 of 46 edits; at a million entries
    a follower re-read for two minutes, and a promotion meanwhile listed them all)."""
    editor, reader = opened(tmp_path, 1.0, "p").entries, opened(tmp_path, 1.0, "p").entries
    assert editor.edit("beat", [Edit("a", None, "a1")]) == [True]
    version = reader.version("beat")
    between, go_on = threading.Event(), threading.Event()
    recorded = file_store.FileEntries._recorded

    def held_between(self: Any, *args: Any) -> Any:
        between.set()  # the entries file is written, its changes are not yet
        assert go_on.wait(10)
        return recorded(self, *args)

    monkeypatch.setattr(file_store.FileEntries, "_recorded", held_between)
    thread = threading.Thread(target=editor.edit, args=("beat", [Edit("a", "a1", "a2")]))
    thread.start()
    assert between.wait(10)
    assert reader.version("beat") == version + 1
    assert reader.changes_since("beat", version) == (version, {}), "asked again, not read all"
    go_on.set()
    thread.join()
    assert reader.changes_since("beat", version) == (version + 1, {"a": "a2"})


def test_entries_read_by_pages_end_where_the_file_is_damaged_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Pages are parsed as the reader asks for them: a file damaged past its first
    entries gives those, then logs it; one that is not ours reads as empty at once."""
    monkeypatch.setattr(file_store, "ENTRIES_PAGE", 2)
    backend = opened(tmp_path, 1.0, "p").entries
    path = tmp_path / "p.beat.entries"
    text = json.dumps({"version": 7, "entries": {"a": "1", "b": " 2 ", "c": "3"}})
    path.write_text(text[:-8] + " oops}")
    version, pages = backend.load_pages("beat")
    assert (version, next(pages)) == (7, {"a": "1", "b": " 2 "})
    assert "p.beat.entries" not in caplog.text
    assert [*pages] == [{}] and "p.beat.entries" in caplog.text
    caplog.clear()
    path.write_text(json.dumps({"entries": {"a": "1"}, "version": 7}))
    version, pages = backend.load_pages("beat")
    assert (version, [*pages]) == (7, [{"a": "1"}]), "not as written here: parsed whole"
    path.write_text("[]")
    version, pages = backend.load_pages("beat")
    assert (version, [*pages]) == (0, [{}]) and "p.beat.entries" in caplog.text


def test_journal_logs_of_any_name_are_files_of_their_own(tmp_path: Path) -> None:
    """A log's file is named by the percent-encoded log (dots too, so none ends like
    an epoch file and makes an election), or by its hash when that would not fit a
    file name; a file that is not a log's reads as empty and the next write replaces it."""
    journal = opened(tmp_path, 1.0, "p").journal
    long = "audit/" + "\u00e9" * 200
    for log in ("audit/x.epoch", long, "terms"):
        journal.write("beat", [JournalWrite(log, "1", log, 10)])
        assert journal.read("beat", log, 10) == [("1", log)]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "p.beat.journal.audit%2Fx%2Eepoch" in names and "p.beat.journal.terms" in names
    assert [n for n in names if n.startswith("p.beat.journal.=")], "the long one, by its hash"
    assert all(len(n.encode()) < 255 - 40 for n in names), "room for a temporary file's tail"
    assert opened(tmp_path, 1.0, "p").lock.holders() == {}, "no election is made of a log name"
    (tmp_path / "p.beat.journal.terms").write_text('{"log": "other", "records": {"2": "x"}}')
    assert journal.read("beat", "terms", 10) == []
    journal.write("beat", [JournalWrite("terms", "3", "z", 10)])
    assert journal.read("beat", "terms", 10) == [("3", "z")]


def _holding(store: Path, ident: str) -> tuple[StoreFacets, Fence]:
    """A store opened in ``store`` (prefix ``p``), and the fence of its term of ``beat``."""
    opened_store = opened(store, 1.0, "p")
    term = opened_store.lock.acquire("beat", ident, TTL, 0).term
    assert term is not None
    return opened_store, Fence("beat", term)


def _log_lines(store: Path) -> dict[str, bytes]:
    """The state's log files: name -> content."""
    return {p.name: p.read_bytes() for p in store.glob("p.beat.state-log.*")}


def _snapshot(store: Path) -> tuple[int, dict[str, str]]:
    """The generation of the log the snapshot names, and the states it holds."""
    head, *lines = (store / "p.beat.state").read_text().splitlines()
    return json.loads(head)["log"], dict(json.loads(line) for line in lines)


def _held(holder: StoreFacets) -> Any:
    """What the holder keeps of the ``beat`` state (its files, digests, compaction)."""
    return holder.records._files.states["beat"]  # type: ignore[attr-defined]


def _compacted(holder: StoreFacets) -> None:
    """Wait until the holder's compaction, if one runs, has ended."""
    held = _held(holder)
    wait_for(lambda: held.compaction is None, 10, message="the compaction did not end")


def test_a_claim_appends_what_it_changed_and_a_thread_compacts_the_logs(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder appends each claim's writes to the log and leaves the snapshot
    alone; once the log holds an eighth of the snapshot's bytes, a thread writes a
    new snapshot of it all, naming the log the claims went on in."""
    monkeypatch.setattr(file_store, "LOG_MIN", 0)
    holder, fence = _holding(store, "a")
    observer = opened(store, 1.0, "p").records
    state = {f"e{i}": f'"{i}"' * 10 for i in range(20)}
    assert holder.records.claim(fence, [Write(k, None, v) for k, v in state.items()]) == [True] * 20
    snapshot = store / "p.beat.state"
    before = os.stat(snapshot)
    assert _snapshot(store) == (1, state)
    for i in range(3):  # 3 lines of 17 bytes: under an eighth of the snapshot's bytes
        assert holder.records.claim(fence, [Write("e0", state["e0"], f'"{i}x"')]) == [True]
        state["e0"] = f'"{i}x"'
        after = os.stat(snapshot)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        assert observer.load("beat") == state
    assert _log_lines(store) == {
        "p.beat.state-log.1": b"".join(b'{"e0": "\\"%dx\\""}\n' % i for i in range(3))
    }
    assert holder.records.load("beat") == state, "the holder reads the files too"
    for i in range(100):
        if _held(holder).compaction is not None or os.stat(snapshot).st_ino != before.st_ino:
            break
        assert holder.records.claim(fence, [Write("e1", state["e1"], f'"{i}"' * 10)]) == [True]
        state["e1"] = f'"{i}"' * 10
    _compacted(holder)
    assert _snapshot(store) == (2, state)
    assert _log_lines(store) == {"p.beat.state-log.2": b""}, "the folded log is gone"
    assert observer.load("beat") == holder.records.load("beat") == state


def test_claims_go_on_in_a_new_log_while_a_compaction_runs(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction freezes the log (its last line names the next) and runs beside
    the claims, which go on in the next log: readers follow the chain meanwhile,
    and the new snapshot names the next log."""
    holder, fence = _holding(store, "a")
    assert holder.records.claim(fence, [Write("x", None, '"1"'), Write("y", None, '"1"')])
    assert holder.records.claim(fence, [Write("x", '"1"', '"2"')]) == [True]
    go_on = threading.Event()
    compact_into = file_store._compact_into

    def held_back(*args: Any) -> None:
        assert go_on.wait(10)
        compact_into(*args)

    delete_logs = file_store._delete_logs

    def slow_delete(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.3)  # a slow disk: the compaction ends once the logs are gone
        delete_logs(*args, **kwargs)

    monkeypatch.setattr(file_store, "_compact_into", held_back)
    monkeypatch.setattr(file_store, "_delete_logs", slow_delete)
    monkeypatch.setattr(file_store, "LOG_MIN", 0)
    assert holder.records.claim(fence, [Write("x", '"2"', '"3"')]) == [True]  # starts one
    assert _held(holder).compaction is not None
    assert _log_lines(store) == {
        "p.beat.state-log.1": b'{"x": "\\"2\\""}\n{"x": "\\"3\\""}\n["next", 2]\n',
        "p.beat.state-log.2": b"",
    }
    for n in range(4, 8):  # no second compaction while the first runs
        assert holder.records.claim(fence, [Write("y", f'"{n - 3}"', f'"{n - 2}"')]) == [True]
    observer = opened(store, 1.0, "p").records
    assert observer.load("beat") == {"x": '"3"', "y": '"5"'}
    go_on.set()
    _compacted(holder)
    assert _snapshot(store) == (2, {"x": '"3"', "y": '"1"'}), "log 2 not folded: it is live"
    assert list(_log_lines(store)) == ["p.beat.state-log.2"]
    assert observer.load("beat") == holder.records.load("beat") == {"x": '"3"', "y": '"5"'}
    assert holder.records.claim(fence, [Write("y", '"5"', '"6"')]) == [True]
    assert observer.load("beat") == {"x": '"3"', "y": '"6"'}
    _compacted(holder)


def test_a_compaction_whose_term_ended_leaves_the_files_alone(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A term that ends while its compaction runs: the compaction does not put its
    snapshot in place (the next holder may have written the files since), and the
    next holder reads every claim from the chain."""
    holder, fence = _holding(store, "a")
    assert holder.records.claim(fence, [Write("x", None, '"1"')]) == [True]
    go_on = threading.Event()
    compact_into = file_store._compact_into
    compacted: list[Path] = []

    def held_back(files: Any, election: str, job: Any, tmp: Path) -> None:
        assert go_on.wait(10)
        compact_into(files, election, job, tmp)
        compacted.append(tmp)

    monkeypatch.setattr(file_store, "_compact_into", held_back)
    monkeypatch.setattr(file_store, "LOG_MIN", 0)
    assert holder.records.claim(fence, [Write("x", '"1"', '"2"' * 20)]) == [True]
    held = _held(holder)
    assert held.compaction is not None
    snapshot = os.stat(store / "p.beat.state")
    holder.lock.release("beat", fence.term)
    go_on.set()
    wait_for(lambda: compacted, 10, message="the compaction did not run")
    wait_for(lambda: not list(store.glob(".p.beat.state.*")), 5, message="its file stayed")
    assert os.stat(store / "p.beat.state").st_ino == snapshot.st_ino
    assert sorted(_log_lines(store)) == ["p.beat.state-log.1", "p.beat.state-log.2"]
    second, fence = _holding(store, "b")
    assert second.records.claim(fence, [Write("x", '"2"' * 20, '"3"')]) == [True]
    assert opened(store, 1.0, "p").records.load("beat") == {"x": '"3"'}
    _compacted(second)


def test_a_failed_compaction_is_tried_again_after_a_while(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction that fails (a full disk, say) loses nothing, the claims go on in
    the logs, and the next one starts ``COMPACT_RETRY`` later, not at every claim."""
    holder, fence = _holding(store, "a")
    assert holder.records.claim(fence, [Write("x", None, '"0"')]) == [True]
    compact_into = file_store._compact_into
    attempts: list[int] = []

    def failing_once(*args: Any) -> None:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            raise OSError(28, "No space left on device")
        compact_into(*args)

    monkeypatch.setattr(file_store, "_compact_into", failing_once)
    monkeypatch.setattr(file_store, "LOG_MIN", 0)
    monkeypatch.setattr(file_store, "COMPACT_RETRY", 3600.0)
    assert holder.records.claim(fence, [Write("x", '"0"', '"1"')]) == [True]
    _compacted(holder)
    for n in range(2, 6):
        assert holder.records.claim(fence, [Write("x", f'"{n - 1}"', f'"{n}"')]) == [True]
    assert attempts == [0], "not tried again at every claim"
    assert opened(store, 1.0, "p").records.load("beat") == {"x": '"5"'}
    _held(holder).retry_at = 0.0
    assert holder.records.claim(fence, [Write("x", '"5"', '"6"')]) == [True]
    _compacted(holder)
    assert attempts == [0, 1]
    assert _snapshot(store) == (3, {"x": '"6"'}), "logs 1 and 2 folded"
    assert list(_log_lines(store)) == ["p.beat.state-log.3"]
    assert opened(store, 1.0, "p").records.load("beat") == {"x": '"6"'}


def test_a_torn_last_line_is_ignored_and_the_next_holder_claims_after_it(store: Path) -> None:
    """A holder that died in the middle of a line leaves it torn: readers ignore
    it, and the next holder cuts it before its first line."""
    first, fence = _holding(store, "a")
    assert first.records.claim(fence, [Write("x", None, '"1"'), Write("y", None, '"1"')])
    assert first.records.claim(fence, [Write("x", '"1"', '"2"')]) == [True]
    first.lock.release("beat", fence.term)
    log = store / "p.beat.state-log.1"
    with log.open("ab") as f:
        f.write(b'{"x": "\\"3')  # the holder died here
    observer = opened(store, 1.0, "p").records
    assert observer.load("beat") == {"x": '"2"', "y": '"1"'}
    second, fence = _holding(store, "b")
    assert second.records.load("beat") == {"x": '"2"', "y": '"1"'}
    assert second.records.claim(fence, [Write("x", '"3"', '"4"')]) == [False]
    assert second.records.claim(fence, [Write("x", '"2"', '"4"')]) == [True]
    assert log.read_bytes() == b'{"x": "\\"2\\""}\n{"x": "\\"4\\""}\n'
    assert observer.load("beat") == {"x": '"4"', "y": '"1"'}


def test_the_previous_releases_state_file_is_read_and_converted_at_the_first_claim(
    store: Path,
) -> None:
    """The previous release kept ``{entry: state}`` in ``p.e.state`` alone."""
    snapshot = store / "p.beat.state"
    snapshot.write_text(json.dumps({"a": '"1"', "log": '"2"', "state": '"3"'}))
    observer = opened(store, 1.0, "p").records
    assert observer.load("beat") == {"a": '"1"', "log": '"2"', "state": '"3"'}
    holder, fence = _holding(store, "a")
    assert holder.records.claim(fence, [Write("a", '"1"', '"4"')]) == [True]
    converted = {"a": '"4"', "log": '"2"', "state": '"3"'}
    assert _snapshot(store) == (1, converted)
    assert observer.load("beat") == converted


def test_a_reader_racing_a_compaction_never_reads_an_older_value(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that read the snapshot before a compaction finds its log gone,
    and reads the new snapshot: never the old snapshot without its log."""
    holder, fence = _holding(store, "a")
    assert holder.records.claim(fence, [Write("x", None, '"1"')]) == [True]
    assert holder.records.claim(fence, [Write("x", '"1"', '"2"')]) == [True]  # in the log
    open_log = file_store._open_log
    compactions = []

    def compact_first(path: Path, flags: int) -> int | None:
        if not compactions:  # between the reader's two reads: the log is compacted
            compactions.append(path.name)
            monkeypatch.setattr(file_store, "LOG_MIN", 0)
            assert holder.records.claim(fence, [Write("x", '"2"', '"3"' + " " * 50)]) == [True]
            _compacted(holder)
        return open_log(path, flags)

    monkeypatch.setattr(file_store, "_open_log", compact_first)
    assert opened(store, 1.0, "p").records.load("beat") == {"x": '"3"' + " " * 50}
    assert compactions == ["p.beat.state-log.1"] and _log_lines(store) == {
        "p.beat.state-log.2": b""
    }


def test_the_holder_keeps_digests_and_refuses_a_claim_whose_expected_state_is_a_byte_off(
    store: Path,
) -> None:
    """The holder reads the state once in its term and keeps a digest of each
    entry's: a claim that expects a text a byte away from the stored one fails."""
    first, fence = _holding(store, "a")
    assert first.records.claim(fence, [Write("x", None, '{"n": 1}')]) == [True]
    first.lock.release("beat", fence.term)
    holder, fence = _holding(store, "b")
    assert holder.records.claim(fence, [Write("x", '{"n":1}', '"2"')]) == [False]  # first read
    held = _held(holder)
    assert held.digests == {"x": file_store._digest('{"n": 1}')}, "no state text kept"
    assert holder.records.claim(fence, [Write("x", '{"n": 1}', '"2"')]) == [True]
    assert holder.records.claim(fence, [Write("x", '{"n": 1}', '"3"')]) == [False], "stale"
    assert holder.records.claim(fence, [Write("x", '"2 "', '"3"')]) == [False]
    assert holder.records.claim(fence, [Write("y", '"2"', '"3"')]) == [False], "nothing stored"
    assert opened(store, 1.0, "p").records.load("beat") == {"x": '"2"'}


@pytest.mark.parametrize(
    "line",
    ['["a"]', '["a", 1]', '"ab"', '[1, "x"]', '["a", "b", "c"]', '{"a": "b"}', "[", '[["a", "b"]]'],
)
def test_a_snapshot_line_that_is_not_an_entry_and_its_state_reads_as_empty(
    store: Path, line: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each line after the first is ``[entry, state]``, two strings: any other reads
    the whole state as empty, and says which file holds it."""
    good = json.dumps(["x", '"1"'])
    (store / "p.beat.state").write_text(f'{{"log": 1}}\n{good}\n{line}\n{good}\n')
    (store / "p.beat.state-log.1").write_bytes(b"")
    assert opened(store, 1.0, "p").records.load("beat") == {}
    assert "p.beat.state" in caplog.text and "not schedule state" in caplog.text


def test_a_read_of_the_whole_state_says_each_part_it_read(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new leader's watchdog counts each part of a long read as progress: a
    snapshot part (:data:`SNAPSHOT_CHUNK` lines) and each log of its chain."""
    monkeypatch.setattr(file_store, "SNAPSHOT_CHUNK", 1)  # a part: lines of 256 bytes or more
    holder, fence = _holding(store, "a")
    state = {f"e{i}": json.dumps({"i": i, "pad": "x" * 300}) for i in range(6)}
    assert holder.records.claim(fence, [Write(k, None, v) for k, v in state.items()])
    assert holder.records.claim(fence, [Write("e0", state["e0"], '"1"')]) == [True]
    state["e0"] = '"1"'
    parts: list[int] = []
    got = opened(store, 1.0, "p").records.load_in_parts("beat", lambda: parts.append(1))
    assert got == state
    assert len(parts) == 6 + 1, "six snapshot lines, one log"


@pytest.mark.parametrize("enabled", [True, False])
def test_a_read_of_the_whole_state_pauses_the_cyclic_collector(
    store: Path, enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused while the state is read, as it was after (a process that paused it
    itself keeps it paused)."""
    holder, fence = _holding(store, "a")
    assert holder.records.claim(fence, [Write("e", None, '"1"')]) == [True]
    during = []
    read_snapshot = file_store._read_snapshot
    monkeypatch.setattr(
        file_store, "_read_snapshot", lambda *a: during.append(gc.isenabled()) or read_snapshot(*a)
    )
    (gc.enable if enabled else gc.disable)()
    try:
        assert opened(store, 1.0, "p").records.load("beat") == {"e": '"1"'}
        assert (during, gc.isenabled()) == ([False], enabled)
    finally:
        gc.enable()


def test_a_new_holders_load_is_the_only_read_before_its_claims(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new leader loads the whole state, then claims: the load reads the files once,
    and the claims make the digests they compare with from what the load read, their
    own keys first and a few more each (a second read, then digesting all at once,
    were seconds of a hand-over at a million entries). A reader's load keeps nothing."""
    monkeypatch.setattr(file_store, "DIGESTS_A_CLAIM", 2)
    digest = file_store._digest
    first, fence = _holding(store, "a")
    state = {f"e{i}": json.dumps({"i": i}) for i in range(5)}
    assert first.records.claim(fence, [Write(k, None, v) for k, v in state.items()])
    first.lock.release("beat", fence.term)
    reads: list[int] = []
    read_state = file_store._read_state
    monkeypatch.setattr(file_store, "_read_state", lambda *a: reads.append(a[2]) or read_state(*a))
    reader = opened(store, 1.0, "p").records
    assert reader.load("beat") == state
    assert reader._files.states == {}, "a reader keeps nothing"  # type: ignore[attr-defined]
    holder, fence = _holding(store, "b")
    loaded = holder.records.load("beat")
    assert loaded == state
    loaded.clear()  # the caller's: the holder kept its own copy
    assert _held(holder).texts == state
    assert reads == [os.O_RDONLY, os.O_RDWR | os.O_APPEND]
    assert holder.records.claim(fence, [Write("e4", state["e4"], '"new"')]) == [True]
    held = _held(holder)
    assert held.texts == {k: state[k] for k in ("e2", "e3")}, "its own key and two more"
    assert held.digests == {
        "e0": digest(state["e0"]),
        "e1": digest(state["e1"]),
        "e4": digest('"new"'),
    }
    assert holder.records.claim(fence, [Write("e3", '"stale"', '"new"')]) == [False]
    assert held.texts is None and len(held.digests) == 5
    state["e4"] = '"new"'
    assert holder.records.claim(fence, [Write("e0", state["e0"], '"new"')]) == [True]
    assert holder.records.load("beat") == {**state, "e0": '"new"'}
    assert reads == [os.O_RDONLY, os.O_RDWR | os.O_APPEND, os.O_RDONLY], (
        "the claims read nothing; a load with digests kept reads as a reader"
    )


def test_a_compaction_after_claims_writes_the_texts_the_claims_wrote(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder keeps digests alone: a compaction takes every text from the
    files, and the claim that triggers it adds its own."""
    holder, fence = _holding(store, "a")
    state = {f"e{i}": json.dumps({"i": i, "s": "\u00e9" * i}) for i in range(10)}
    assert holder.records.claim(fence, [Write(k, None, v) for k, v in state.items()])
    for i in range(3):  # appended to the log
        new = f'{{"i": {i},  "again": true}}'
        assert holder.records.claim(fence, [Write(f"e{i}", state[f"e{i}"], new)]) == [True]
        state[f"e{i}"] = new
    assert list(_log_lines(store)) == ["p.beat.state-log.1"]
    monkeypatch.setattr(file_store, "LOG_MIN", 0)
    for i in range(100):  # until one compacts
        key = f"e{3 + i % 7}"
        new = json.dumps([i, "x" * 200])
        assert holder.records.claim(fence, [Write(key, state[key], new)]) == [True]
        state[key] = new
        if _held(holder).compaction is not None or "p.beat.state-log.1" not in _log_lines(store):
            break
    _compacted(holder)
    assert _snapshot(store) == (2, state), "the claim that started it, in the frozen log too"
    assert opened(store, 1.0, "p").records.load("beat") == state
