"""Counters that a worker's pool processes add to and its main process serves.

The run ledger counts in the pool processes, but the main process serves the
metrics: it creates a small file named in :data:`ENV_VAR` before its pool starts.
An addition takes the file's ``flock`` for a few microseconds: run-ledger events
are a few per beat-sent message, never per task.

Layout: :data:`SLOTS` slots of 64 bytes: a NUL-padded UTF-8 key
(``"<name>\\0<label>"``, at most 55 bytes) and a native ``int64`` count.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import mmap
import os
import struct
import tempfile
from collections.abc import Iterator

#: Environment variable naming the file, for the pool processes.
ENV_VAR = "CELERY_LEADER_COUNTERS"
#: Distinct (name, label) pairs the file holds; the ledger uses a handful.
SLOTS = 128
_SLOT = 64
_KEY = _SLOT - 8


class SharedCounters:
    """One worker's counter file, mapped in this process."""

    def __init__(self, path: str, owner: int) -> None:
        self.path = path
        #: The process that created the file and serves what it holds.
        self.owner = owner
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, SLOTS * _SLOT)

    @classmethod
    def create(cls) -> SharedCounters:
        """A new, empty file for this process's pool, named in :data:`ENV_VAR`."""
        fd, path = tempfile.mkstemp(prefix=f"celery-leader-counters-{os.getpid()}-")
        try:
            os.ftruncate(fd, SLOTS * _SLOT)
        finally:
            os.close(fd)
        made = cls(path, os.getpid())
        os.environ[ENV_VAR] = path
        atexit.register(made.remove)
        return made

    @classmethod
    def from_env(cls) -> SharedCounters | None:
        """The file this process's parent created, if it named one (else ``None``).

        Each process opens the file itself: a ``flock`` held through a descriptor
        inherited over ``fork`` would exclude nobody who shares it.
        """
        path = os.environ.get(ENV_VAR)
        if not path:
            return None
        try:
            return cls(path, owner=0)
        except (OSError, ValueError):
            return None  # removed meanwhile, or not ours: count nothing rather than fail

    def add(self, name: str, label: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``name`` with ``label``; dropped when the file is full."""
        key = f"{name}\0{label}".encode()[:_KEY]
        with self._locked():
            for offset in range(0, SLOTS * _SLOT, _SLOT):
                stored = self._map[offset : offset + _KEY].rstrip(b"\0")
                if stored in (key, b""):
                    if not stored:
                        self._map[offset : offset + _KEY] = key.ljust(_KEY, b"\0")
                    (count,) = struct.unpack_from("=q", self._map, offset + _KEY)
                    struct.pack_into("=q", self._map, offset + _KEY, count + amount)
                    return

    def read(self) -> dict[tuple[str, str], int]:
        """Every counter in the file: (name, label) -> its total."""
        out: dict[tuple[str, str], int] = {}
        with self._locked():
            for offset in range(0, SLOTS * _SLOT, _SLOT):
                stored = self._map[offset : offset + _KEY].rstrip(b"\0")
                if not stored:
                    break
                name, _, label = stored.decode(errors="replace").partition("\0")
                out[(name, label)] = struct.unpack_from("=q", self._map, offset + _KEY)[0]
        return out

    def remove(self) -> None:
        """Delete the file (the owner, at exit)."""
        if os.getpid() == self.owner:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
