"""``file:///dir``: ``fcntl.flock`` leases for instances on one host.

Files of election ``e`` under key prefix ``p``, all in ``dir``:

* ``p.e.lock``   - the lock; held with ``flock(LOCK_EX)`` by the leader
* ``p.e.holder`` - JSON of the current term (token, epoch, holder, pid)
* ``p.e.epoch``  - last epoch handed out; written only under the lock
* ``p.e.resign`` - the term an operator asked to hand over
* ``p.e.state``  - JSON of the shared schedule state

The kernel drops a flock when its holder's process dies, and a follower
blocked in ``flock`` wakes up holding it: a crash hands over at once, with no
ttl to wait out. A paused (SIGSTOP) holder keeps the lock: the file store is
safe, but only as live as its holder process.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ..exceptions import ConfigError, StoreUnavailable
from .base import Acquired, Backend, Claim, HolderInfo, Renewal, Tenure, apply_claims


class _Waiter:
    """A thread blocked in ``flock`` on behalf of a follower.

    When the lock comes free the kernel hands it to this thread, which parks
    the open descriptor for the follower's next ``acquire``. A waiter whose
    follower left closes the descriptor at once, so it never sits on the lock.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.won = threading.Event()
        self.fd: int | None = None
        self.cancelled = False
        self._lock = threading.Lock()
        threading.Thread(
            target=self._run, name=f"celery-leader-flock:{path.name}", daemon=True
        ).start()

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            self.won.set()  # let the follower retry and see the error itself
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        with self._lock:
            if self.cancelled:
                os.close(fd)
                return
            self.fd = fd
        self.won.set()

    def take(self) -> int | None:
        with self._lock:
            fd, self.fd = self.fd, None
            return fd

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class FileBackend(Backend):
    """Lease store in a local directory; see the module docstring."""

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        super().__init__(url, key_prefix, timeout)
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"leader_url {url!r}: a file:// URL must name a local directory")
        self.directory = Path(unquote(parts.path))
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"leader_url {url!r}: cannot create the directory: {exc}") from exc
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, Tenure]] = {}
        self._waiters: dict[str, _Waiter] = {}

    def _path(self, election: str, kind: str) -> Path:
        return self.directory / f"{self.key_prefix}.{election}.{kind}"

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        lock_path = self._path(election, "lock")
        with self._lock:
            waiter = self._waiters.get(election)
            if waiter is not None and waiter.won.is_set():
                del self._waiters[election]
        if waiter is not None and not waiter.won.is_set():
            # Our waiter is queued in flock: the kernel hands it the lock first.
            return Acquired(None, self._read_holder(election), ttl)
        fd = waiter.take() if waiter is not None else None  # None: its open failed
        try:
            if fd is None:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return Acquired(None, self._read_holder(election), ttl)
            inode = os.fstat(fd).st_ino
            if inode != os.stat(lock_path).st_ino:
                # The lock file was replaced while we waited: this lock guards nothing.
                os.close(fd)
                return Acquired(None, None, 0.0)
            previous = _read_json(self._path(election, "holder"))
            if _believes_elsewhere(previous, inode):
                # The last holder locked a lock file that has since been deleted
                # and may still believe it leads: it finds out at its next
                # renewal and releases (removing its holder file). Until then,
                # taking this new lock would make two leaders.
                os.close(fd)
                return Acquired(None, self._read_holder(election), self.timeout)
            epoch = max(_read_int(self._path(election, "epoch")), min_epoch) + 1
            _write(self._path(election, "epoch"), str(epoch))
            token = json.dumps(
                {
                    "token": uuid.uuid4().hex,
                    "epoch": epoch,
                    "holder": instance_id,
                    "pid": os.getpid(),
                    "inode": inode,
                }
            )
            _write(self._path(election, "holder"), token)
        except OSError as exc:
            raise StoreUnavailable(f"{lock_path}: {exc}") from exc
        tenure = Tenure(token, epoch)
        with self._lock:
            self._held[election] = (fd, tenure)
        return Acquired(tenure, None, ttl)

    def _holds(self, election: str, tenure: Tenure) -> int | None:
        """Our descriptor if ``tenure`` is current and its lock file is still in place."""
        with self._lock:
            held = self._held.get(election)
        if held is None or held[1] != tenure:
            return None
        fd = held[0]
        try:
            if os.fstat(fd).st_ino != os.stat(self._path(election, "lock")).st_ino:
                return None
        except OSError:
            return None
        return fd

    def renew(self, election: str, tenure: Tenure, ttl: float) -> Renewal:
        if self._holds(election, tenure) is None:
            return Renewal.LOST
        resign = self._path(election, "resign")
        if _read_text(resign) == tenure.token:
            resign.unlink(missing_ok=True)
            return Renewal.RESIGN
        return Renewal.RENEWED

    def release(self, election: str, tenure: Tenure) -> None:
        with self._lock:
            held = self._held.get(election)
            if held is None or held[1] != tenure:
                return
            del self._held[election]
        if _read_text(self._path(election, "holder")) == tenure.token:
            self._path(election, "holder").unlink(missing_ok=True)
        os.close(held[0])  # closing the last descriptor drops the flock

    def wait(self, election: str, timeout: float, cancel: threading.Event) -> None:
        with self._lock:
            waiter = self._waiters.get(election)
            if waiter is None:
                waiter = self._waiters[election] = _Waiter(self._path(election, "lock"))
        end = timeout
        while end > 0 and not cancel.is_set():
            if waiter.won.wait(min(end, 0.1)):
                return
            end -= 0.1

    def holder(self, election: str) -> HolderInfo | None:
        try:
            fd = os.open(self._path(election, "lock"), os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return self._read_holder(election)
        finally:
            os.close(fd)  # if we got the lock, this drops it again at once
        return None

    def _read_holder(self, election: str) -> HolderInfo | None:
        data = _read_json(self._path(election, "holder"))
        if not isinstance(data, dict) or not isinstance(data.get("epoch"), int):
            return None
        return HolderInfo(str(data.get("holder", "?")), data["epoch"], None)

    def request_resign(self, election: str) -> HolderInfo | None:
        info = self.holder(election)
        token = _read_text(self._path(election, "holder"))
        if info is None or token is None:
            return None
        _write(self._path(election, "resign"), token)
        return info

    def elections(self) -> list[str]:
        prefix = f"{self.key_prefix}."
        return sorted(
            p.name[len(prefix) : -len(".epoch")]
            for p in self.directory.glob(f"{self.key_prefix}.*.epoch")
        )

    def load_state(self, election: str) -> dict[str, str]:
        data = _read_json(self._path(election, "state"))
        if not isinstance(data, dict):
            return {}
        return {str(k): v for k, v in data.items() if isinstance(v, str)}

    def claim(self, election: str, tenure: Tenure, claims: Sequence[Claim]) -> list[bool]:
        # Only the flock holder writes the state file, so read-compare-write
        # needs no further locking.
        if self._holds(election, tenure) is None:
            return [False] * len(claims)
        state = self.load_state(election)
        results = apply_claims(state, claims)
        if any(results):
            try:
                _write(self._path(election, "state"), json.dumps(state))
            except OSError as exc:
                raise StoreUnavailable(f"cannot write schedule state: {exc}") from exc
        return results

    def leave(self, election: str) -> None:
        with self._lock:
            waiter = self._waiters.pop(election, None)
        if waiter is not None:
            waiter.cancel()

    def close(self) -> None:
        for election in list(self._waiters):
            self.leave(election)


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


def _write(path: Path, text: str) -> None:
    """Replace ``path`` atomically, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def _read_int(path: Path) -> int:
    text = _read_text(path)
    try:
        return int(text) if text else 0
    except ValueError:
        return 0
