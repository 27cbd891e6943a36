"""``file:///dir``: ``fcntl.flock`` leases for instances on one host.

Election ``e`` under prefix ``p`` keeps its files in ``dir`` as ``p.e.<kind>``
(docs/stores/file.md). The leader holds ``flock`` of ``p.e.lock``; a follower
blocked in ``flock`` gets it the moment the holder's process dies. Every file is
replaced atomically (write, then rename), or appended to by whole lines, so
readers need no lock.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import quote, unquote, urlsplit

from ..collector import collector_paused
from ..exceptions import ConfigError, StoreUnavailable
from . import StoreFacets, StoreParams
from .entry_store import Edit, EntryStore, apply_edits
from .journal import Journal, JournalWrite
from .lock import Acquired, HolderInfo, LeaseLock, Renewal, Term
from .records import Fence, FencedRecords, Write, apply_writes, unchanged
from .run_store import RunStore, RunSummary, RunWrite, run_entry
from .runbook import EntryBook
from .terms import holder_info, new_term, parse_epoch, unreadable_state
from .waiting import LockWaiter, wait_sliced

#: Edited entries the changes file keeps, values included (a reader further behind
#: reads every entry): bounds the file every reader parses to a few hundred KB.
CHANGES_KEPT = 1_000

#: Entries per page of :meth:`FileEntries.load_pages`: parsing one takes
#: milliseconds, so the first page is there long before a large file is parsed.
ENTRIES_PAGE = 10_000

#: The longest percent-encoded log name a journal file is named by; a longer
#: one is named by its hash, so that every name fits the 255 bytes a file
#: name may take, with the key prefix, the election and a temporary file's tail.
JOURNAL_NAME_MAX = 100

#: The schedule state's logs are folded into a new snapshot once they hold more
#: than an eighth of the snapshot's bytes, and not before this many: a claim
#: appends its writes alone, and each rewrite of every entry's state is paid for
#: by an eighth as many bytes of claims (amortised, a constant per claim: eight
#: bytes rewritten a byte claimed, in the compaction's thread). An eighth, not
#: the whole size, because the compaction holds the logs' states in memory while
#: it streams the snapshot through: at a million entries a quarter kept 1,020
#: bytes of RSS an entry in the leader, over the 1 KB the other stores stay under.
LOG_SHARE = 8
LOG_MIN = 1 << 20

#: A compaction that failed (a full disk, say) is tried again after this many
#: seconds, not at every claim: each attempt reads every entry's state.
COMPACT_RETRY = 60.0

#: Texts a claim digests beside its own while the holder keeps the texts its load
#: read (:meth:`_State.digest_some`): about 20 ms, so a million take 50 claims.
DIGESTS_A_CLAIM = 20_000

#: Snapshot lines parsed at once, about this many (one ``json.loads`` of a JSON
#: array of them, read by ``readlines`` with a byte hint of 256 bytes a line).
SNAPSHOT_CHUNK = 10_000

#: What a reader of the schedule state keeps of each entry's state: its text, or
#: the holder's digest of it.
_V = TypeVar("_V")

#: How ``p.e.entries`` starts (``json.dumps`` keeps the keys in order): the version
#: is read from the first bytes at every look.
_HEAD = re.compile(rb'\{"version": (\d+), ')

#: The same head, through the start of the entries, in the text read by pages.
_ENTRIES_HEAD = re.compile(r'\{"version": (\d+), "entries": \{')

#: JSON's white space, skipped between the tokens of the entries.
_SPACE = re.compile(r"[ \t\n\r]*")


def open_store(params: StoreParams) -> StoreFacets:
    """The file store of ``params.url``; creates its directory, touches no file yet."""
    # config checked the form (file:///absolute/dir); only the path is ours to read.
    directory = Path(unquote(urlsplit(params.url).path))
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"leader_url {params.url!r}: cannot create the directory: {exc}") from exc
    files = _Files(directory, params.key_prefix)
    lock = FileLock(files, params)
    return StoreFacets(
        params,
        lock,
        FileRecords(files),
        FileEntries(files),
        FileRuns(files),
        FileJournal(files),
        lock.close,
    )


@dataclass(frozen=True, eq=False)
class _Files:
    """One directory and key prefix: each election's files, and the flocks held there."""

    directory: Path
    prefix: str
    #: Guards :attr:`held` and :attr:`waiters`.
    mutex: threading.Lock = field(default_factory=threading.Lock)
    #: election -> the descriptor holding its flock, and the term written under it.
    held: dict[str, tuple[int, Term]] = field(default_factory=dict)
    #: election -> this process's follower queued in its ``flock``.
    waiters: dict[str, LockWaiter[int]] = field(default_factory=dict)
    #: Guards :attr:`states`, and the state files of the elections held here.
    state_mutex: threading.Lock = field(default_factory=threading.Lock)
    #: election -> its schedule state, kept by the holder of its flock.
    states: dict[str, _State] = field(default_factory=dict)

    def path(self, election: str, kind: str) -> Path:
        return self.directory / f"{self.prefix}.{election}.{kind}"

    def log(self, election: str, generation: int) -> Path:
        """The schedule state's log that snapshot ``generation`` continues with."""
        return self.path(election, f"state-log.{generation}")

    def logs(self, election: str) -> dict[int, Path]:
        """Every log of the schedule state on disk, by generation."""
        prefix = f"{self.prefix}.{election}.state-log."
        with _io(self.directory):
            paths = self.directory.glob(f"{glob.escape(prefix)}*")
            return {int(p.name[len(prefix) :]): p for p in paths if p.name[len(prefix) :].isdigit()}

    def forget_state(self, election: str) -> None:
        """Drop the schedule state kept for ``election`` (its term is over here)."""
        with self.state_mutex:
            held = self.states.pop(election, None)
        if held is not None:
            held.close()

    def holds(self, election: str, term: Term) -> bool:
        """Whether ``term`` holds the flock of ``election``, on the lock file in place."""
        with self.mutex:
            held = self.held.get(election)
        try:
            return (
                held is not None
                and held[1] == term
                and os.fstat(held[0]).st_ino == os.stat(self.path(election, "lock")).st_ino
            )
        except OSError:
            return False

    @contextmanager
    def turn(self, election: str, kind: str, wait: bool = True) -> Iterator[bool]:
        """Hold a ``flock`` of file ``kind`` of ``election``: term-less writers take turns.
        Yields whether it is held: with ``wait`` False, not when another holds it."""
        path = self.path(election, kind)
        with _io(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                except BlockingIOError:
                    held = False
                yield held
            finally:
                os.close(fd)


class _Facet:
    """A facet of the file store: all of them work on one :class:`_Files`."""

    def __init__(self, files: _Files) -> None:
        self._files = files


class FileLock(_Facet, LeaseLock):
    """Terms held as flocks; a follower queues one thread in ``flock`` per election."""

    def __init__(self, files: _Files, params: StoreParams) -> None:
        super().__init__(files)
        self.url, self.timeout = params.url, params.timeout

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        lock_path = self._files.path(election, "lock")
        with self._files.mutex:
            waiter = self._files.waiters.get(election)
            if waiter is not None and waiter.done.is_set():
                del self._files.waiters[election]
        if waiter is not None and not waiter.done.is_set():
            # Our waiter is queued in flock: the kernel hands it the lock first.
            return Acquired(None, self._holder_file(election), ttl)
        fd = waiter.take() if waiter is not None else None  # None: its wait failed
        with _io(lock_path):
            if fd is None:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return Acquired(None, self._holder_file(election), ttl)
            try:
                result = self._start_term(election, fd, instance_id, ttl, min_epoch)
            except BaseException:
                os.close(fd)
                raise
        if result.term is None:
            _close(fd)
            return result
        with self._files.mutex:
            self._files.held[election] = (fd, result.term)
        return result

    def _start_term(
        self, election: str, fd: int, instance_id: str, ttl: float, min_epoch: int
    ) -> Acquired:
        """Write a new term under the flock on ``fd``, unless this lock guards nothing."""
        path = self._files.path
        inode = os.fstat(fd).st_ino
        if inode != os.stat(path(election, "lock")).st_ino:
            # The lock file was replaced while we waited: this lock guards nothing.
            return Acquired(None, None, 0.0)
        if _believes_elsewhere(_read_json(path(election, "holder")), inode):
            # The last holder locked a lock file since deleted and may still believe it
            # leads until its next renewal: taking this new lock would make two leaders.
            return Acquired(None, self._holder_file(election), self.timeout)
        epoch_path = path(election, "epoch")
        text = _read_text(epoch_path)
        epoch = max(parse_epoch(text, str(epoch_path)) if text else 0, min_epoch) + 1
        _write(epoch_path, str(epoch))
        # One host shares one clock: its wall clock is the store's.
        term = new_term(epoch, instance_id, time.time(), pid=os.getpid(), inode=inode)
        _write(path(election, "holder"), term.token)
        return Acquired(term, None, ttl)

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, None]:
        if not self._files.holds(election, term):
            return Renewal.LOST, None
        resign = self._files.path(election, "resign")
        if _read_text(resign) == term.token:
            with _io(resign):
                resign.unlink(missing_ok=True)
            return Renewal.RESIGN, None
        return Renewal.RENEWED, None

    def release(self, election: str, term: Term | None) -> None:
        if term is None:
            with self._files.mutex:
                waiter = self._files.waiters.pop(election, None)
            if waiter is not None:
                waiter.cancel()  # a lock it won meanwhile goes with it
            return
        with self._files.mutex:
            held = self._files.held.get(election)
            if held is None or held[1] != term:
                return
            del self._files.held[election]
        self._files.forget_state(election)
        holder = self._files.path(election, "holder")
        try:
            if _read_text(holder) == term.token:
                with _io(holder):
                    holder.unlink(missing_ok=True)
        finally:
            _close(held[0])

    def _wait_free(self, election: str, timeout: float, cancel: threading.Event) -> None:
        # A holder just waits: a flock lasts as long as its process, no connection to lose.
        with self._files.mutex:
            waiter = self._files.waiters.get(election)
        if waiter is None:
            lock_path = self._files.path(election, "lock")
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                return  # the next acquire meets the same error and reports it
            waiter = LockWaiter(fd, _flock, _close, name=f"celery-leader-flock:{lock_path.name}")
            with self._files.mutex:
                self._files.waiters[election] = waiter
        wait_sliced(waiter.done.wait, timeout, cancel)

    def holders(self, elections: Sequence[str] | None = None) -> dict[str, HolderInfo | None]:
        if elections is None:
            prefix = f"{self._files.prefix}."
            elections = sorted(
                p.name[len(prefix) : -len(".epoch")]
                for p in self._files.directory.glob(f"{prefix}*.epoch")
            )
        return {election: self._holder(election) for election in elections}

    def _holder(self, election: str) -> HolderInfo | None:
        """The holder of ``election``'s flock, if anyone holds it."""
        lock_path = self._files.path(election, "lock")
        with _io(lock_path):
            try:
                fd = os.open(lock_path, os.O_RDWR)
            except FileNotFoundError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return self._holder_file(election)
            finally:
                os.close(fd)  # if we got the lock, this drops it again at once
        return None

    def _holder_file(self, election: str) -> HolderInfo | None:
        """The term of the flock's holder; None while it has not written one yet."""
        path = self._files.path(election, "holder")
        text = _read_text(path)
        return None if text is None else holder_info(text, str(path), None)

    def request_resign(self, election: str) -> HolderInfo | None:
        info = self._holder(election)
        token = _read_text(self._files.path(election, "holder"))
        if info is None or token is None:
            return None
        _write(self._files.path(election, "resign"), token)
        return info

    def close(self) -> None:
        """Leave the queue of every election (the store's ``close``)."""
        for election in list(self._files.waiters):
            self.release(election, None)


def _nothing() -> None:
    """No one to tell of a read's progress."""


class FileRecords(_Facet, FencedRecords):
    """Schedule state in a snapshot ``p.e.state`` and the chain of logs of claims it
    continues with, ``p.e.state-log.<generation>``: only the flock's holder writes
    them. It keeps a digest of every entry's state in memory between claims, so a
    claim compares with those and appends what it changed; a thread of its own
    folds the logs into a new snapshot, off the claims' path. Everyone, the holder
    too, reads the state from the files, all at once (no :meth:`load_some`); the
    holder's first read of a term is also the one its digests are made from."""

    def load(self, election: str) -> dict[str, str]:
        return self.load_in_parts(election, _nothing)

    def load_in_parts(self, election: str, progress: Callable[[], None]) -> dict[str, str]:
        """The state, ``progress`` called after each :data:`SNAPSHOT_CHUNK` lines and each log."""
        values: dict[str, str] = {}
        files = self._files
        with files.state_mutex:
            # A new leader loads the whole state before its first claim, which needs
            # the digest of every entry's state: one read serves both. Two reads were
            # most of a standby's 7.3 to 7.7 s from a hand-over to its first dispatch
            # at a million entries (3 s to read the states, 5 s to read their digests).
            kept = files.states.get(election)
            held = self._held(election, None, values, progress)
            if held is not None and held is not kept:
                return values
        _read_state(files, election, os.O_RDONLY, values, unchanged, progress)
        return values

    def compare_and_set(self, fence: Fence, writes: Sequence[Write]) -> list[bool]:
        # Only the flock holder writes the state files, so read-compare-write
        # needs no further locking, and the digests it read stay true in its memory.
        with self._files.state_mutex:
            held = self._held(fence.election, fence.term)
            if held is None:
                return [False] * len(writes)
            if held.texts is not None:
                held.digest_some([w.key for w in writes])
            results = apply_writes(held.digests, writes, _digest)
            if any(results):
                # The last won write of a key is its state now.
                changed = {w.key: w.new for w, ok in zip(writes, results, strict=True) if ok}
                try:
                    self._store(fence.election, held, changed)
                except BaseException:
                    # Memory may be ahead of the files: read them again at the next claim.
                    self._files.states.pop(fence.election, None)
                    held.close()
                    raise
            return results

    def _held(
        self,
        election: str,
        term: Term | None,
        values: dict[str, str] | None = None,
        progress: Callable[[], None] = _nothing,
    ) -> _State | None:
        """The state of ``election`` if this process holds its flock (under ``term``,
        when given), read from the files when they are not the ones it knows; the
        caller holds :attr:`_Files.state_mutex`. A read fills ``values``, if given,
        with every entry's state, calling ``progress`` as :meth:`load_in_parts` does."""
        files = self._files
        with files.mutex:
            lease = files.held.get(election)
        kept = files.states.pop(election, None)
        if lease is None or (term is not None and lease[1] != term):
            held = None
        elif not files.holds(election, lease[1]):
            held = None
        elif kept is not None and kept.token == lease[1].token and kept.on_disk(files, election):
            held, kept = kept, None
        else:
            flags = os.O_RDWR | os.O_APPEND
            if values is None:
                digests: dict[str, bytes] = {}
                held = _read_state(files, election, flags, digests, _digest)
                held.digests = digests
            else:
                held = _read_state(files, election, flags, values, unchanged, progress)
                held.texts = dict(values)  # the caller's to change
            held.token = lease[1].token
        if kept is not None:
            kept.close()  # a compaction of it, if one runs, finds it gone and stops
        if held is not None:
            files.states[election] = held
        return held

    def _store(self, election: str, held: _State, changed: dict[str, str]) -> None:
        """Append ``changed`` to the live log as one line, and start a compaction when
        the logs have grown past their share (see :data:`LOG_SHARE`)."""
        if held.generation is None or held.fd is None or held.snapshot is None:
            self._rewrite(election, held, changed)
            return
        _append(self._files.log(election, held.generation), held, json.dumps(changed))
        logs = held.whole + held.frozen
        if (
            held.compaction is None
            and logs > max(held.snapshot[1] // LOG_SHARE, LOG_MIN)
            and time.monotonic() >= held.retry_at
        ):
            self._start_compaction(election, held)

    def _rewrite(self, election: str, held: _State, changed: dict[str, str]) -> None:
        """Write the first snapshot as this release writes them, with a new, empty log,
        reading every entry's state from the files (its memory keeps digests): there
        is none yet (a new election), the previous release's plain one, or one whose
        log is gone. In the claim that needs it, unlike a compaction: it happens once."""
        files = self._files
        values: dict[str, str] = {}
        _read_state(files, election, os.O_RDONLY, values, unchanged)
        values.update(changed)
        logs = files.logs(election)
        generation = max([held.generation or 0, *logs]) + 1
        fd = _create_log(files.log(election, generation))
        try:
            snapshot = files.path(election, "state")
            tmp = _temporary(snapshot, "tmp")
            _write_snapshot(tmp, generation, iter([values]))
            with _io(snapshot):
                os.replace(tmp, snapshot)
            identity = _identity(snapshot)
        except BaseException:
            _close(fd)
            raise
        held.close()
        held.fd, held.generation, held.snapshot = fd, generation, identity
        held.size = held.whole = held.frozen = 0
        _delete_logs(logs, below=generation)

    def _start_compaction(self, election: str, held: _State) -> None:
        """Freeze the live log and fold the snapshot and its logs into a new snapshot,
        in a thread; claims go on to a new log meanwhile (the caller holds
        :attr:`_Files.state_mutex`)."""
        files = self._files
        frozen = held.generation
        assert frozen is not None and held.fd is not None and held.snapshot is not None
        try:
            live = max([frozen, *files.logs(election)]) + 1
            # The new log first: a crash before the frozen log names it leaves an
            # empty file no reader looks at, which the next compaction deletes.
            fd = _create_log(files.log(election, live))
            try:
                _append(files.log(election, frozen), held, json.dumps(["next", live]))
            except BaseException:
                _close(fd)
                raise
        except StoreUnavailable:
            # The claim is in the log already: it stands. A torn "next" line is cut
            # by the next append.
            held.retry_at = time.monotonic() + COMPACT_RETRY
            return
        held.close()
        held.fd, held.generation = fd, live
        held.frozen += held.whole
        held.size = held.whole = 0
        job = _Compaction(held.snapshot, live)
        held.compaction = job
        name = f"celery-leader-compact:{files.path(election, 'state').name}"
        thread = threading.Thread(target=self._compact, args=(election, held, job), name=name)
        thread.daemon = True  # a process that exits leaves it: the next holder compacts
        thread.start()

    def _compact(self, election: str, held: _State, job: _Compaction) -> None:
        """Write the state of the snapshot ``job`` read and of its logs up to the one
        ``job`` froze into a new snapshot naming the live log, then, if this process
        still holds that state, put it in place and delete the folded logs: a reader
        that finds a log of its chain gone reads the snapshot again, so it never
        replays an old log over a newer snapshot. Runs in its own thread."""
        files = self._files
        path = files.path(election, "state")
        tmp = _temporary(path, "compacting")
        # A compaction of a process that died left its file: only the holder writes
        # these, and this holder runs one at a time.
        for left in path.parent.glob(f".{glob.escape(path.name)}.*.compacting"):
            with suppress(OSError):
                left.unlink()
        try:
            _compact_into(files, election, job, tmp)
            with files.state_mutex:
                if files.states.get(election) is not held or held.compaction is not job:
                    return  # the term ended, or the files changed: not ours to replace
                with _io(path):
                    os.replace(tmp, path)
                held.snapshot = _identity(path)
                held.frozen = 0
                _delete_logs(files.logs(election), below=job.live)
                # Last: whoever sees no compaction running sees its folded logs gone.
                held.compaction = None
        except Exception:
            # Tried again after COMPACT_RETRY; the logs keep every claim meanwhile.
            with files.state_mutex:
                if held.compaction is job:
                    held.compaction = None
                    held.retry_at = time.monotonic() + COMPACT_RETRY
        finally:
            with suppress(OSError):
                tmp.unlink()


def _digest(text: str) -> bytes:
    """What the holder keeps of an entry's state: 128 bits of BLAKE2b, so a stale
    ``expected`` passes for the stored state with a chance of 2**-128 a compare."""
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@dataclass(frozen=True)
class _Compaction:
    """One compaction: the snapshot it folds (its identity when the logs were frozen)
    and the generation of the log the new snapshot names (live from then on)."""

    snapshot: tuple[int, int, int]
    live: int


@dataclass
class _State:
    """Where the schedule state of an election was read from; the holder of the
    election's flock keeps it, its entries' digests and its live log open between
    claims."""

    #: The generation of the live log (the last of the snapshot's chain); None: no
    #: snapshot as this release writes them (none, the previous release's, or not
    #: ours), so the next claim writes one.
    generation: int | None
    #: (inode, size, mtime) of the snapshot read; None: there was none.
    snapshot: tuple[int, int, int] | None
    #: Bytes of the live log read, and of its whole lines (a torn last line lies past them).
    size: int = 0
    whole: int = 0
    #: The live log, open for appends (the holder's); None: none, or a reader's.
    fd: int | None = None
    #: The term the holder read it under.
    token: str = ""
    #: entry -> :func:`_digest` of its state (the holder's; a reader's is empty).
    digests: dict[str, bytes] = field(default_factory=dict)
    #: entry -> its state, as the holder's load read it, whose digest is not made yet
    #: (see :meth:`digest_some`); None: none left.
    texts: dict[str, str] | None = None
    #: Bytes of the chain's logs before the live one (those a compaction folds).
    frozen: int = 0
    #: The compaction running, if any.
    compaction: _Compaction | None = None
    #: No compaction starts before this (monotonic): the last one failed.
    retry_at: float = 0.0

    def digest_some(self, keys: Sequence[str]) -> None:
        """Move the texts of ``keys`` (a claim's), and :data:`DIGESTS_A_CLAIM` others, to
        :attr:`digests`: digesting a million at once took 0.7 to 1.5 s, in the tick of
        a new leader's first dispatch."""
        texts = self.texts
        assert texts is not None
        digests = self.digests
        for key in keys:
            if (text := texts.pop(key, None)) is not None:
                digests[key] = _digest(text)
        for key in list(itertools.islice(texts, DIGESTS_A_CLAIM)):
            digests[key] = _digest(texts.pop(key))
        if not texts:
            self.texts = None

    def close(self) -> None:
        """Close the live log kept open for appends, if any."""
        if self.fd is not None:
            _close(self.fd)
            self.fd = None

    def on_disk(self, files: _Files, election: str) -> bool:
        """Whether the files are still the ones this state was read from and written to."""
        if _identity(files.path(election, "state")) != self.snapshot:
            return False
        if self.fd is None or self.generation is None:
            return True  # no log to check: the next claim writes a snapshot
        try:
            now = os.stat(files.log(election, self.generation))
            return (now.st_ino, now.st_size) == (os.fstat(self.fd).st_ino, self.size)
        except OSError:
            return False


def _read_state(
    files: _Files,
    election: str,
    flags: int,
    into: dict[str, _V],
    keep: Callable[[str], _V],
    progress: Callable[[], None] = _nothing,
) -> _State:
    """Read the snapshot and its chain of logs into ``into`` (entry -> ``keep`` of its
    state) and say where from, the live log kept open unless ``flags`` are a reader's
    (``O_RDONLY``): a log of the chain compacted away meanwhile means a newer snapshot
    is in place, which is read instead. ``progress`` is called after each part read;
    the cyclic garbage collector is paused meanwhile (:func:`collector_paused`)."""
    path = files.path(election, "state")
    with collector_paused():
        while True:
            into.clear()
            with _io(path):
                try:
                    f = path.open("rb")
                except FileNotFoundError:
                    return _State(None, None)
                with f:
                    stat = os.fstat(f.fileno())
                    identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                    generation = _read_snapshot(f, str(path), into, keep, progress)
            if generation is None:
                return _State(None, identity)
            held = _read_chain(files, election, generation, identity, flags, into, keep, progress)
            if held is not None:
                return held
            if _identity(path) != identity:
                continue  # compacted meanwhile: the new snapshot holds what the logs held
            return _State(generation, identity)  # a log lost: the next claim writes a snapshot


def _read_snapshot(
    f: BinaryIO,
    where: str,
    into: dict[str, _V],
    keep: Callable[[str], _V],
    progress: Callable[[], None],
) -> int | None:
    """Read a snapshot from ``f`` into ``into``: the generation of the log it continues
    with (None: the previous release's plain ``{entry: state}``, or not ours: empty).
    Its lines are parsed :data:`SNAPSHOT_CHUNK` at a time, one JSON array each: one
    ``json.loads`` a line would cost a call an entry, and the whole file at once its
    text and every state's at the same time."""
    first = f.readline()
    try:
        head = json.loads(first)
    except ValueError:
        head = None
    if not (isinstance(head, dict) and list(head) == ["log"] and isinstance(head["log"], int)):
        data = first + f.read()
        try:
            found = json.loads(data)
        except ValueError:
            found = None
        if isinstance(found, dict) and _strings(found):
            into.update((k, keep(v)) for k, v in found.items())  # the previous release's
        else:
            unreadable_state(where, data[:100].decode(errors="replace"))
        return None
    try:
        for chunk in _snapshot_chunks(f):
            into.update(zip(chunk, map(keep, chunk.values()), strict=True))
            progress()
    except ValueError as exc:
        into.clear()  # read as empty, as any unreadable state
        unreadable_state(where, str(exc))
        return None
    return int(head["log"])


def _snapshot_chunks(f: BinaryIO) -> Iterator[dict[str, str]]:
    """The ``[entry, state]`` lines of a snapshot after its first, read on from ``f``
    :data:`SNAPSHOT_CHUNK` at a time, each chunk parsed as one JSON array; ValueError
    naming the first lines of a chunk that is not such lines."""
    while lines := f.readlines(SNAPSHOT_CHUNK * 256):
        try:
            pairs = json.loads(b"[" + b",".join(lines) + b"]")
        except ValueError:
            pairs = None
        # Checked by passes in C (map, set): a Python check a line took 0.4 s of the
        # 3 s a million states take to read.
        shaped = isinstance(pairs, list) and set(map(type, pairs)) <= {list}
        chunk = dict(pairs) if shaped and set(map(len, pairs)) <= {2} else None
        if chunk is None or not set(map(type, chunk)) | set(map(type, chunk.values())) <= {str}:
            raise ValueError(b"".join(lines)[:100].decode(errors="replace"))
        yield chunk


def _read_chain(
    files: _Files,
    election: str,
    generation: int,
    snapshot: tuple[int, int, int],
    flags: int,
    into: dict[str, _V],
    keep: Callable[[str], _V],
    progress: Callable[[], None],
) -> _State | None:
    """Replay the logs from ``generation`` on, each naming the next in its last line,
    into ``into``; where they were read from (``snapshot`` and the live log, kept open
    unless ``flags`` are a reader's), or None when a log of the chain is gone."""
    frozen = 0
    while True:
        log = files.log(election, generation)
        fd = _open_log(log, flags)
        if fd is None:
            return None
        try:
            with _io(log):
                text = _read_all(fd)
        except BaseException:
            _close(fd)
            raise
        whole, following = _replay(into, keep, text, str(log), generation)
        progress()
        if following is None:
            if flags == os.O_RDONLY:
                _close(fd)
                return _State(generation, snapshot, len(text), whole, frozen=frozen)
            return _State(generation, snapshot, len(text), whole, fd, frozen=frozen)
        _close(fd)
        frozen += whole
        generation = following


def _replay(
    into: dict[str, _V], keep: Callable[[str], _V], text: bytes, where: str, generation: int
) -> tuple[int, int | None]:
    """Apply the claims of a log's whole lines to ``into``: the bytes they take, and
    the generation of the log it continues in (its last line, once frozen; always a
    later one than its own, ``generation``). A last line without its newline is one
    being written, or torn: ignored."""
    whole = text.rfind(b"\n") + 1
    start = 0
    following = None
    while start < whole:
        end = text.index(b"\n", start)
        try:
            line = json.loads(text[start:end])
        except ValueError:
            line = None
        if following is None and isinstance(line, dict) and _strings(line):
            into.update((k, keep(v)) for k, v in line.items())
        elif (
            following is None
            and isinstance(line, list)
            and len(line) == 2
            and line[0] == "next"
            and isinstance(line[1], int)
            and line[1] > generation
        ):
            following = line[1]
        else:
            unreadable_state(f"{where} at byte {start}", text[start : start + 100])
        start = end + 1
    return whole, following


def _compact_into(files: _Files, election: str, job: _Compaction, tmp: Path) -> None:
    """Write the new snapshot of ``job`` to ``tmp``: the snapshot's entries in their
    order, each with its last state in the frozen logs, then the entries new in them.
    Only the logs' states are held in memory at once: at most a :data:`LOG_SHARE` of
    the snapshot's bytes, where a whole read would hold every entry's state."""
    path = files.path(election, "state")
    changes: dict[str, str] = {}
    with _io(path), path.open("rb") as f:
        stat = os.fstat(f.fileno())
        if (stat.st_ino, stat.st_size, stat.st_mtime_ns) != job.snapshot:
            raise OSError(f"{path} was replaced since the logs were frozen")
        first = json.loads(f.readline())["log"]
        generation = first
        while generation != job.live:
            log = files.log(election, generation)
            following = None
            # A few MB at a time: the log's bytes are as many as its states'.
            with _io(log), log.open("rb") as lines:
                while chunk := lines.readlines(1 << 22):
                    found = _replay(changes, unchanged, b"".join(chunk), str(log), generation)[1]
                    following = following if found is None else found
            if following is None:
                raise OSError(f"{log} does not lead to log {job.live}")
            generation = following

        def merged() -> Iterator[dict[str, str]]:
            for chunk in _snapshot_chunks(f):
                yield {k: changes.pop(k, v) for k, v in chunk.items()}
            yield changes

        _write_snapshot(tmp, job.live, merged())


def _write_snapshot(path: Path, generation: int, chunks: Iterator[dict[str, str]]) -> None:
    """Write to ``path`` (a temporary file the caller renames into place) a snapshot
    continuing with log ``generation``: a line ``{"log": n}``, then a line
    ``["entry", "state"]`` per entry."""
    with _io(path), path.open("w") as f:
        f.write(json.dumps({"log": generation}) + "\n")
        for chunk in chunks:
            f.writelines(json.dumps([k, v]) + "\n" for k, v in chunk.items())


def _append(log: Path, held: _State, line: str) -> None:
    """Append ``line`` to the live log of ``held``, cutting a torn last line first."""
    data = (line + "\n").encode()
    assert held.fd is not None
    with _io(log):
        if held.size > held.whole:
            # A holder died writing its last line: cut it before appending after it.
            os.ftruncate(held.fd, held.whole)
            held.size = held.whole
        written = os.write(held.fd, data)
        held.size += written
        if written < len(data):
            raise OSError(f"wrote {written} of {len(data)} bytes")
        held.whole = held.size


def _create_log(path: Path) -> int:
    """A new, empty log, open for appends."""
    with _io(path):
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)


def _delete_logs(logs: dict[int, Path], *, below: int) -> None:
    """Delete the logs of ``logs`` older than generation ``below``: folded into the
    snapshot that names it, or left empty by a compaction that died before its frozen
    log named it."""
    for generation, path in logs.items():
        if generation < below:
            with _io(path):
                path.unlink(missing_ok=True)


def _open_log(path: Path, flags: int) -> int | None:
    """``path`` opened with ``flags``; None when it is not there."""
    with _io(path):
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            return None


def _read_all(fd: int) -> bytes:
    """Everything from the start of ``fd`` to its end."""
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 24, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _strings(values: dict[Any, Any]) -> bool:
    return all(isinstance(v, str) for v in values.values())


def _identity(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of ``path``; None when it is not there."""
    with _io(path):
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


class FileEntries(_Facet, EntryStore):
    """Schedule entries in ``p.e.entries``, and the latest edits in ``p.e.entries-changes``."""

    def version(self, election: str) -> int:
        path = self._files.path(election, "entries")
        with _io(path):
            try:
                with path.open("rb") as f:
                    head = _HEAD.match(f.read(64))
            except FileNotFoundError:
                return 0
        return int(head.group(1)) if head else self.load(election)[0]

    def load(self, election: str) -> tuple[int, dict[str, str]]:
        path = self._files.path(election, "entries")
        text = _read_text(path)
        if text is None:
            return 0, {}
        try:
            data = json.loads(text)
            version, entries = data["version"], data["entries"]
        except (ValueError, TypeError, KeyError):
            version = entries = None
        if not isinstance(version, int) or not isinstance(entries, dict):
            return 0, unreadable_state(str(path), text)
        return version, entries

    def load_pages(self, election: str) -> tuple[int, Iterator[dict[str, str]]]:
        # The file is one JSON text, read at once (one consistent view: files are
        # replaced whole); it is parsed a page at a time, so a reader acts on the first
        # entries before the rest are parsed. Parsing by pages costs 1.7 times the CPU
        # of one json.loads, and the text stays in memory until the last page.
        path = self._files.path(election, "entries")
        text = _read_text(path)
        head = None if text is None else _ENTRIES_HEAD.match(text)
        if text is None or head is None:
            return super().load_pages(election)  # none, or not as we write it: load says
        return int(head.group(1)), _entry_pages(text, head.end(), str(path))

    def changes_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        # The version first: the changes file is written after the entries, so one
        # behind it is being written (asked again) or never was (read everything).
        now = self.version(election)
        if now == version:
            return now, {}
        changes = self._changes(election)
        if changes is not None and changes[0] < now:
            # The edit that moved the version writes its changes next, holding the entries
            # lock: asked again at the next poll. A reader that polled between the two
            # files read every entry again (two minutes at a million). With the lock
            # free, no edit is under way: the files are read again as they are.
            with self._files.turn(election, "entries-lock", wait=False) as free:
                if not free:
                    return version, {}
                now, changes = self.version(election), self._changes(election)
        if now < version or changes is None or changes[0] < now or changes[1] > version:
            return None
        return changes[0], {k: v for k, (at, v) in changes[2].items() if at > version}

    def _changes(self, election: str) -> tuple[int, int, dict[str, list[Any]]] | None:
        """The changes file: (its version, the oldest version it answers from, edits)."""
        data = _read_json(self._files.path(election, "entries-changes"))
        try:
            return int(data["version"]), int(data["from"]), dict(data["edits"])
        except (TypeError, KeyError, ValueError):
            return None  # none yet, or not ours: readers read everything

    def edit(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        # Editors of one host take turns; the files are replaced atomically,
        # so a leader reading them needs no lock.
        with self._files.turn(election, "entries-lock"):
            version, entries = self.load(election)
            results = apply_edits(entries, edits)
            if any(results):
                text = json.dumps({"version": version + 1, "entries": entries})
                _write(self._files.path(election, "entries"), text)
                applied = [e for e, ok in zip(edits, results, strict=True) if ok]
                changes = self._recorded(election, version, applied)
                _write(self._files.path(election, "entries-changes"), json.dumps(changes))
            return results

    def _recorded(self, election: str, version: int, applied: list[Edit]) -> dict[str, Any]:
        """The changes file after ``applied`` moved the entries on from ``version``."""
        changes = self._changes(election)
        if changes is None or changes[0] != version:
            # It does not reach this version: readers from before it read everything.
            start, kept = version, {}
        else:
            start, kept = changes[1], changes[2]
        for edit in applied:
            kept.pop(edit.key, None)  # to the end: the dict stays oldest first
            kept[edit.key] = [version + 1, edit.new]  # the last applied edit of a key is its value
        if len(kept) > CHANGES_KEPT:
            # Sliced, not popped one by one from the front: that is quadratic in a
            # dict (each pop's iter skips the slots freed before it), and an edit of
            # a million entries at once would take hours.
            names = list(kept)
            cut = len(names) - CHANGES_KEPT
            start = max(start, *(kept[k][0] for k in names[:cut]))
            kept = {k: kept[k] for k in names[cut:]}
        return {"version": version + 1, "from": start, "edits": kept}


class FileRuns(_Facet, RunStore):
    """Run records (``p.e.run.<entry>``, ``p.e.runsum.<entry>``) and marks (``p.e.runs``)."""

    def put(self, election: str, write: RunWrite) -> tuple[bool, str | None]:
        key, expected, new, ttl = write.key, write.expected, write.new, write.ttl
        entry = run_entry(key)
        with self._files.turn(election, "runs.lock"):
            runs = self._live_marks(election)
            stored = runs.get(key)
            current = None if stored is None else stored[0]
            if entry is None:
                if current != expected:
                    return False, current
                runs[key] = (new, time.time() + ttl)
                _write(self._files.path(election, "runs"), json.dumps(runs))
                return True, new
            # A slot the previous release wrote among the marks moves to its entry.
            book_path = self._entry_path(election, "run", entry)
            book = EntryBook.from_json(_read_json(book_path))
            now = time.time()
            won, now_stored = book.put(
                key, expected, new, now + ttl, now, write.keep, write.tally, current
            )
            if won:
                _write(book_path, json.dumps(book.to_json()))
                summary = book.summary(entry, now)
                # The newest write's expiry is the entry's: past it, nothing is kept.
                kept = {"until": now + ttl, **({} if summary is None else asdict(summary))}
                _write(self._entry_path(election, "runsum", entry), json.dumps(kept))
                if stored is not None:
                    del runs[key]
                    _write(self._files.path(election, "runs"), json.dumps(runs))
            return won, now_stored

    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        book = EntryBook.from_json(_read_json(self._entry_path(election, "run", entry)))
        return book.newest(time.time(), limit)

    def summaries(self, election: str) -> list[RunSummary]:
        prefix = f"{self._files.prefix}.{election}.runsum."
        out = []
        now = time.time()
        with _io(self._files.directory):
            paths = sorted(self._files.directory.glob(f"{glob.escape(prefix)}*"))
        for path in paths:
            data = _read_json(path)
            entry = unquote(path.name[len(prefix) :])
            try:
                if float(data["until"]) > now:
                    out.append(
                        RunSummary(entry, str(data["last_key"]), data["last"], data["counts"])
                    )
            except (TypeError, KeyError, ValueError):
                continue  # removed, or damaged: records are for visibility alone
        return out

    def _entry_path(self, election: str, kind: str, entry: str) -> Path:
        return self._files.path(election, f"{kind}.{quote(entry, safe='')}")

    def _live_marks(self, election: str) -> dict[str, tuple[str, float]]:
        # Unreadable content is dropped: records are kept for visibility and
        # deduplication, never for schedule state.
        data = _read_json(self._files.path(election, "runs"))
        now = time.time()
        if not isinstance(data, dict):
            return {}
        return {
            key: (str(item[0]), float(item[1]))
            for key, item in data.items()
            if isinstance(item, list) and len(item) == 2 and float(item[1]) > now
        }


class FileJournal(_Facet, Journal):
    """Journal logs, one file each (``p.e.journal.<log>``), written by any process
    in turns under a ``flock`` of ``p.e.journal-lock``."""

    def write(self, election: str, writes: Sequence[JournalWrite]) -> None:
        if not writes:
            return
        with self._files.turn(election, "journal-lock"):
            logs: dict[str, dict[str, str]] = {}
            for w in writes:
                if w.log not in logs:
                    logs[w.log] = self._records(election, w.log)
                records = logs[w.log]
                records[w.key] = w.data
                for key in sorted(records)[: max(0, len(records) - w.keep)]:
                    del records[key]
            for log, records in logs.items():
                text = json.dumps({"log": log, "records": records})
                _write(self._log_path(election, log), text)

    def read(
        self, election: str, log: str, limit: int, before: str | None = None
    ) -> list[tuple[str, str]]:
        records = self._records(election, log)
        keys = sorted((k for k in records if before is None or k < before), reverse=True)
        return [(k, records[k]) for k in keys[: max(0, limit)]]

    def _records(self, election: str, log: str) -> dict[str, str]:
        """The records of ``log``: none when its file is missing or not ours (the
        journal is for people to read, never to decide on)."""
        data = _read_json(self._log_path(election, log))
        records = data.get("records") if isinstance(data, dict) else None
        if not isinstance(records, dict) or data.get("log") != log:
            return {}
        return {str(k): str(v) for k, v in records.items()}

    def _log_path(self, election: str, log: str) -> Path:
        """The file of ``log``: its name percent-encoded, dots too (so that no
        name ends like another kind of file, ``.epoch``), or its SHA-256 after
        ``=`` (which percent-encoding never leaves) when that is too long."""
        name = quote(log, safe="").replace(".", "%2E")
        if len(name) > JOURNAL_NAME_MAX:
            name = "=" + hashlib.sha256(log.encode()).hexdigest()
        return self._files.path(election, f"journal.{name}")


def _entry_pages(text: str, at: int, where: str) -> Iterator[dict[str, str]]:
    """The entries of the JSON object that starts before ``at`` in ``text``, by pages
    of :data:`ENTRIES_PAGE`; a damaged rest is logged and ends the pages."""
    scan = json.decoder.scanstring  # type: ignore[attr-defined]
    page: dict[str, str] = {}
    try:
        at = _past_space(text, at)
        more = text[at] != "}"
        while more:
            key, at = scan(text, _expect(text, at, '"'))
            at = _past_space(text, _expect(text, _past_space(text, at), ":"))
            page[key], at = scan(text, _expect(text, at, '"'))
            at = _past_space(text, at)
            more = text[at] == ","
            at = _past_space(text, _expect(text, at, "," if more else "}"))
            if len(page) >= ENTRIES_PAGE:
                yield page
                page = {}
    except (ValueError, IndexError):
        yield page
        unreadable_state(where, text)
        return
    yield page


def _past_space(text: str, at: int) -> int:
    """Where JSON's white space from ``at`` on ends."""
    space = _SPACE.match(text, at)
    return at if space is None else space.end()


def _expect(text: str, at: int, token: str) -> int:
    """Just past ``token`` at ``at``; ValueError when something else is there."""
    if text[at] != token:
        raise ValueError(f"{token!r} expected at {at}")
    return at + 1


@contextmanager
def _io(path: Path) -> Iterator[None]:
    """Turn an ``OSError`` on ``path`` into :class:`StoreUnavailable` naming it."""
    try:
        yield
    except OSError as exc:
        raise StoreUnavailable(f"{path}: {exc.strerror or exc}") from exc


def _flock(fd: int, cancelled: threading.Event) -> bool:
    """Block in ``flock`` until the kernel grants the lock (a follower's waiter)."""
    with suppress(OSError):  # the follower's next acquire tries afresh and reports it
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    return False


def _close(fd: int) -> None:
    with suppress(OSError):  # closed already: the flock is gone with it
        os.close(fd)  # closing the last descriptor drops the flock


def _believes_elsewhere(previous: Any, inode: int) -> bool:
    """Whether the holder file names a live process that locked another inode."""
    if not isinstance(previous, dict):
        return False
    pid, their_inode = previous.get("pid"), previous.get("inode")
    if not isinstance(pid, int) or their_inode in (None, inode):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False  # it died, and its belief with it
    except PermissionError:
        pass  # alive, run by another user
    return True


def _temporary(path: Path, kind: str) -> Path:
    """A hidden file beside ``path`` of this process's and thread's own, renamed over
    ``path`` once written whole."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{kind}")


def _write(path: Path, text: str) -> None:
    """Replace ``path`` atomically, so a reader never sees half a file."""
    tmp = _temporary(path, "tmp")
    with _io(path):
        tmp.write_text(text)
        os.replace(tmp, path)


def _read_text(path: Path) -> str | None:
    """The content of ``path``; None when there is no such file."""
    with _io(path):
        try:
            return path.read_text()
        except FileNotFoundError:
            return None


def _read_json(path: Path) -> Any:
    """Lenient read, for a record left under a free lock (stale, whatever it holds)."""
    text = _read_text(path)
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None
