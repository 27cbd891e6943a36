"""The deadline table: how a worker's pool processes learn who leads.

The main process writes, per election, the ``time.monotonic()`` deadline of its
belief and its term's epoch into a memory-mapped file (``CLOCK_MONOTONIC`` is one
clock for the whole machine). Forked children inherit the mapping; spawned ones
open the file :data:`ENV_VAR` names. Only the owner and its direct children trust it.

Layout (the header little-endian, the slots in native byte order)::

    0   magic  b"CLTAB001"
    8   u32    owner pid
    12  u32    number of slots
    16  u32    length of the JSON header that follows
    20  u32    reserved
    24  JSON   {"store": ..., "names": [...]}, padded with zeros to a multiple of 64
    ..  slots  32 bytes each: i64 seq, f64 valid_until, i64 epoch, 8 bytes pad

Slots are read and written as aligned 8-byte words (one machine load or store,
never torn), so ``is_leader()`` reads ``valid_until`` without a lock; the pair
(valid_until, epoch) is kept consistent by a seqlock on ``seq``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

#: Environment variable naming the table file, for spawned pool processes.
ENV_VAR = "CELERY_LEADER_TABLE"

_MAGIC = b"CLTAB001"
_HEADER = struct.Struct("<8sIIII")
_SLOT_SIZE = 32
_ALIGN = 64
#: Reads of a slot that is being written before the reader gives up.
_READ_TRIES = 64
_SUFFIX = ".table"
_PREFIX = "celery_leader."


def store_id(url: str, key_prefix: str) -> str:
    """Identity of a lease store as written in a table; no password in clear."""
    return hashlib.sha256(f"{url}\n{key_prefix}".encode()).hexdigest()[:16]


def _table_dir() -> Path:
    # /dev/shm keeps the file in memory (no disk writes on every write of a deadline);
    # elsewhere the temp dir works the same, only with page cache behind it.
    shm = Path("/dev/shm")  # noqa: S108 - files are created O_EXCL, mode 0600
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


class DeadlineTable:
    """A mapped deadline table: :meth:`create` (the writer) or :meth:`open` (a reader)."""

    def __init__(
        self, path: Path, buf: mmap.mmap, owner_pid: int, store: str, names: list[str]
    ) -> None:
        self.path = path
        self.owner_pid = owner_pid
        self.store = store
        self.names = names
        # Two views of the same words: seq and epoch as int64, valid_until as float64.
        self._ints = memoryview(buf).cast("q")
        self._floats = memoryview(buf).cast("d")
        self._slots_at = _slots_offset(len(_encode_header(store, names)))
        self._index = {name: i for i, name in enumerate(names)}
        self._write_lock = threading.Lock()
        self._lock_fd: int | None = None

    @classmethod
    def create(cls, store: str, names: list[str]) -> DeadlineTable:
        """Create, map and lock a table for ``names`` (every slot "not leading"); renamed
        into place under an exclusive ``flock``, so :func:`sweep_stale` spares it."""
        directory = _table_dir()
        sweep_stale(directory)
        encoded = _encode_header(store, names)
        size = _slots_offset(len(encoded)) + _SLOT_SIZE * len(names)
        stem = f"{_PREFIX}{os.getpid()}.{uuid.uuid4().hex[:12]}"
        tmp = directory / f"{stem}.tmp"
        final = directory / f"{stem}{_SUFFIX}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, size)
            buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            _HEADER.pack_into(buf, 0, _MAGIC, os.getpid(), len(names), len(encoded), 0)
            buf[_HEADER.size : _HEADER.size + len(encoded)] = encoded
            os.rename(tmp, final)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        table = cls(final, buf, os.getpid(), store, names)
        table._lock_fd = fd
        return table

    def write(self, name: str, valid_until: float, epoch: int) -> None:
        """Write one election's deadline and epoch (owner only)."""
        word = self._word(self._index[name])
        ints = self._ints
        with self._write_lock:
            seq = ints[word]
            ints[word] = seq + 1
            self._floats[word + 1] = valid_until
            ints[word + 2] = epoch
            ints[word] = seq + 2

    def remove(self) -> None:
        """Unlink the file and drop the lock (owner only); mappings stay."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> DeadlineTable:
        """Map an existing table read-only."""
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ)
        if len(buf) < _HEADER.size:
            raise ValueError(f"{path} is not a celery-leader table (too short)")
        magic, owner, count, header_len, _ = _HEADER.unpack_from(buf, 0)
        if magic != _MAGIC:
            raise ValueError(f"{path} is not a celery-leader table (magic {magic!r})")
        header = json.loads(bytes(buf[_HEADER.size : _HEADER.size + header_len]))
        names = header.get("names") if isinstance(header, dict) else None
        if not isinstance(names, list) or len(names) != count:
            raise ValueError(f"{path} is not a celery-leader table (bad header)")
        if len(buf) != _slots_offset(header_len) + _SLOT_SIZE * count:
            raise ValueError(f"{path} is not a celery-leader table (size {len(buf)})")
        return cls(Path(path), buf, owner, str(header.get("store")), [str(n) for n in names])

    def trusted_here(self) -> bool:
        """True in the owner and its direct children (the pool processes)."""
        return self.owner_pid in (os.getpid(), os.getppid())

    def index(self, name: str) -> int | None:
        """Slot of ``name``, or ``None`` when the table does not carry it."""
        return self._index.get(name)

    def read(self, index: int) -> tuple[float, int]:
        """``(valid_until, epoch)`` of slot ``index``; ``(0.0, 0)`` if it stays busy."""
        word = self._word(index)
        ints = self._ints
        for _ in range(_READ_TRIES):
            seq = ints[word]
            if seq & 1:
                continue
            valid_until, epoch = self._floats[word + 1], ints[word + 2]
            if ints[word] == seq:
                return valid_until, epoch
        return 0.0, 0

    def epoch_reader(self, index: int) -> Callable[[], int | None]:
        """A function: the epoch in slot ``index`` while its deadline lies ahead, else None.

        A write in progress is waited for while the deadline word says "leading":
        answering "not leading" meanwhile would turn a leader's task away.
        """
        read = self.read
        floats = self._floats
        word = self._word(index) + 1
        monotonic = time.monotonic
        sleep = time.sleep

        def epoch() -> int | None:
            while True:
                valid_until, value = read(index)
                if monotonic() < valid_until:
                    return value
                if not monotonic() < floats[word]:
                    return None
                sleep(0)  # a write is in progress: let its writer run

        return epoch

    def checker(self, index: int) -> Callable[[], bool]:
        """A function telling whether the deadline in slot ``index`` lies ahead."""
        floats = self._floats
        word = self._word(index) + 1
        monotonic = time.monotonic

        def leads() -> bool:
            return monotonic() < floats[word]

        return leads

    def _word(self, index: int) -> int:
        return (self._slots_at + index * _SLOT_SIZE) // 8


def _encode_header(store: str, names: list[str]) -> bytes:
    return json.dumps({"store": store, "names": names}).encode()


def _slots_offset(header_len: int) -> int:
    end = _HEADER.size + header_len
    return (end + _ALIGN - 1) // _ALIGN * _ALIGN


def sweep_stale(directory: Path) -> None:
    """Remove tables whose owner is gone: a live owner holds an exclusive ``flock``."""
    for path in directory.glob(f"{_PREFIX}*{_SUFFIX}"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile, or not ours to read
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        finally:
            os.close(fd)


_current: DeadlineTable | None = None


def set_process_table(table: DeadlineTable | None) -> None:
    """Serve ``table`` to this process and the pool processes it starts, or stop serving."""
    global _current
    _current = table
    if table is None:
        os.environ.pop(ENV_VAR, None)
    else:
        # Spawned pool processes copy the environment when they start.
        os.environ[ENV_VAR] = str(table.path)


def process_table() -> DeadlineTable | None:
    """The table this process may trust, if any: the one :func:`set_process_table` gave,
    else the file that :data:`ENV_VAR` names (spawned children)."""
    global _current
    table = _current
    if table is None:
        path = os.environ.get(ENV_VAR)
        if not path:
            return None
        try:
            table = _current = DeadlineTable.open(path)
        except (OSError, ValueError):
            return None
    return table if table.trusted_here() else None
