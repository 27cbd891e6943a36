"""``file:///dir``: ``fcntl.flock`` leases for instances on one host.

Files of election ``e`` under key prefix ``p``, all in ``dir``:

* ``p.e.lock``   - the lock; held with ``flock(LOCK_EX)`` by the leader
* ``p.e.holder`` - JSON of the current term (token, epoch, holder, since, pid)
* ``p.e.epoch``  - last epoch handed out; written only under the lock
* ``p.e.resign`` - the term an operator asked to hand over
* ``p.e.state``  - JSON of the shared schedule state
* ``p.e.runs``   - JSON of the run ledger's marks, key -> [value, expiry (Unix
  time)]; rewritten under ``flock`` of ``p.e.runs.lock`` by any process (workers
  hold no term)
* ``p.e.run.<entry>`` - JSON of one entry's run records (the entry name
  percent-encoded), and ``p.e.runsum.<entry>`` its summary: a status read
  reads the summaries alone. Written under the same ``flock``
* ``p.e.entries`` - JSON ``{"version", "entries"}`` of the schedule entries,
  edited under a ``flock`` of ``p.e.entries-lock`` (by any process, no term)
* ``p.e.entries-changes`` - JSON ``{"version", "from", "edits"}``: the latest
  edited entry names with the version of their edit and their value then
  (``null``: removed), written after ``p.e.entries`` by the same editor, so a
  reader pays for an edit what it touched

The kernel drops a flock when its holder's process dies, and a follower
blocked in ``flock`` wakes up holding it: a crash hands over at once, with no
ttl to wait out. A paused (SIGSTOP) holder keeps the lock: the file store is
safe, but only as live as its holder process.

Every ``OSError`` becomes :class:`~celery_leader.exceptions.StoreUnavailable`
naming the file. A holder or epoch file celery-leader cannot read is foreign
(see :mod:`celery_leader.backends.terms`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from ..exceptions import ConfigError, StoreUnavailable
from .base import Backend
from .fenced import Edit, RunSummary, Write, apply_edits, apply_writes, run_entry
from .lock import Acquired, HolderInfo, Renewal, Term
from .runbook import EntryBook
from .terms import holder_info, new_term, parse_epoch, unreadable_state
from .waiting import LockWaiter, wait_sliced

#: Edited entries the changes file keeps, values included: a reader that fell
#: further behind (edits of more entries than this between two of its looks,
#: twice a second) reads every entry. Bounds the file every reader parses after
#: an edit to a few hundred KB.
CHANGES_KEPT = 1_000

#: How ``p.e.entries`` starts (``json.dumps`` keeps the keys in the order
#: written, by this release and the previous ones): the version is read from
#: the first bytes, not from the whole file, at every look.
_HEAD = re.compile(rb'\{"version": (\d+), ')


@contextmanager
def _io(path: Path) -> Iterator[None]:
    """Turn an ``OSError`` on ``path`` into :class:`StoreUnavailable` naming it."""
    try:
        yield
    except OSError as exc:
        raise StoreUnavailable(f"{path}: {exc.strerror or exc}") from exc


def _flock(fd: int, cancelled: threading.Event) -> bool:
    """Block in ``flock`` until the kernel grants the lock (a follower's waiter)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        return False  # the follower's next acquire tries afresh and reports it
    return True


def _close(fd: int) -> None:
    try:
        os.close(fd)  # closing the last descriptor drops the flock
    except OSError:
        pass  # closed already: the flock is gone with it


class FileBackend(Backend):
    """Lease store in a local directory; see the module docstring."""

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        super().__init__(url, key_prefix, timeout)
        # config checked the form (file:///absolute/dir); only the path is ours to read.
        self.directory = Path(unquote(urlsplit(url).path))
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"leader_url {url!r}: cannot create the directory: {exc}") from exc
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, Term]] = {}
        self._waiters: dict[str, LockWaiter[int]] = {}

    def _path(self, election: str, kind: str) -> Path:
        return self.directory / f"{self.key_prefix}.{election}.{kind}"

    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        lock_path = self._path(election, "lock")
        with self._lock:
            waiter = self._waiters.get(election)
            if waiter is not None and waiter.done.is_set():
                del self._waiters[election]
        if waiter is not None and not waiter.done.is_set():
            # Our waiter is queued in flock: the kernel hands it the lock first.
            return Acquired(None, self._read_holder(election), ttl)
        fd = waiter.take() if waiter is not None else None  # None: its wait failed
        with _io(lock_path):
            if fd is None:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return Acquired(None, self._read_holder(election), ttl)
            try:
                result = self._start_term(election, fd, instance_id, ttl, min_epoch)
            except BaseException:
                os.close(fd)
                raise
        if result.term is None:
            _close(fd)
            return result
        with self._lock:
            self._held[election] = (fd, result.term)
        return result

    def _start_term(
        self, election: str, fd: int, instance_id: str, ttl: float, min_epoch: int
    ) -> Acquired:
        """Write a new term under the flock on ``fd``, unless this lock guards nothing."""
        lock_path = self._path(election, "lock")
        inode = os.fstat(fd).st_ino
        if inode != os.stat(lock_path).st_ino:
            # The lock file was replaced while we waited: this lock guards nothing.
            return Acquired(None, None, 0.0)
        previous = _read_json(self._path(election, "holder"))
        if _believes_elsewhere(previous, inode):
            # The last holder locked a lock file that has since been deleted
            # and may still believe it leads: it finds out at its next
            # renewal and releases (removing its holder file). Until then,
            # taking this new lock would make two leaders.
            return Acquired(None, self._read_holder(election), self.timeout)
        epoch_path = self._path(election, "epoch")
        text = _read_text(epoch_path)
        epoch = max(parse_epoch(text, str(epoch_path)) if text else 0, min_epoch) + 1
        _write(epoch_path, str(epoch))
        # One host shares one clock: its wall clock is the store's.
        term = new_term(epoch, instance_id, time.time(), pid=os.getpid(), inode=inode)
        _write(self._path(election, "holder"), term.token)
        return Acquired(term, None, ttl)

    def _holds(self, election: str, term: Term) -> int | None:
        """Our descriptor if ``term`` is current and its lock file is still in place."""
        with self._lock:
            held = self._held.get(election)
        if held is None or held[1] != term:
            return None
        fd = held[0]
        try:
            if os.fstat(fd).st_ino != os.stat(self._path(election, "lock")).st_ino:
                return None
        except OSError:
            return None
        return fd

    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, None]:
        if self._holds(election, term) is None:
            return Renewal.LOST, None
        resign = self._path(election, "resign")
        if _read_text(resign) == term.token:
            with _io(resign):
                resign.unlink(missing_ok=True)
            return Renewal.RESIGN, None
        return Renewal.RENEWED, None

    def release(self, election: str, term: Term) -> None:
        with self._lock:
            held = self._held.get(election)
            if held is None or held[1] != term:
                return
            del self._held[election]
        holder = self._path(election, "holder")
        try:
            if _read_text(holder) == term.token:
                with _io(holder):
                    holder.unlink(missing_ok=True)
        finally:
            _close(held[0])

    def wait(self, election: str, timeout: float, cancel: threading.Event) -> None:
        with self._lock:
            waiter = self._waiters.get(election)
        if waiter is None:
            lock_path = self._path(election, "lock")
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                return  # the next acquire meets the same error and reports it
            waiter = LockWaiter(fd, _flock, _close, name=f"celery-leader-flock:{lock_path.name}")
            with self._lock:
                self._waiters[election] = waiter
        wait_sliced(waiter.done.wait, timeout, cancel)

    def holder(self, election: str) -> HolderInfo | None:
        lock_path = self._path(election, "lock")
        with _io(lock_path):
            try:
                fd = os.open(lock_path, os.O_RDWR)
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
        """The term of the flock's holder; None while it has not written one yet."""
        path = self._path(election, "holder")
        text = _read_text(path)
        return None if text is None else holder_info(text, str(path), None)

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
        path = self._path(election, "state")
        text = _read_text(path)
        if text is None:
            return {}
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            return unreadable_state(str(path), text)
        return data

    def compare_and_set(self, election: str, term: Term, claims: Sequence[Write]) -> list[bool]:
        # Only the flock holder writes the state file, so read-compare-write
        # needs no further locking.
        if self._holds(election, term) is None:
            return [False] * len(claims)
        state = self.load_state(election)
        results = apply_writes(state, claims)
        if any(results):
            _write(self._path(election, "state"), json.dumps(state))
        return results

    def put_run(
        self,
        election: str,
        key: str,
        expected: str | None,
        new: str,
        ttl: float,
        *,
        keep: int = 0,
        tally: str = "",
    ) -> tuple[bool, str | None]:
        entry = run_entry(key)
        with self._runs_locked(election):
            runs = self._live_runs(election)
            stored = runs.get(key)
            current = None if stored is None else stored[0]
            if entry is None:
                if current != expected:
                    return False, current
                runs[key] = (new, time.time() + ttl)
                _write(self._path(election, "runs"), json.dumps(runs))
                return True, new
            # A slot the previous release wrote among the marks moves to its entry.
            book_path = self._entry_path(election, "run", entry)
            book = EntryBook.from_json(_read_json(book_path))
            now = time.time()
            won, now_stored = book.put(key, expected, new, now + ttl, now, keep, tally, current)
            if won:
                _write(book_path, json.dumps(book.to_json()))
                summary = book.summary(entry, now)
                # The newest write's expiry is the entry's: past it, nothing is kept.
                kept = {"until": now + ttl, **({} if summary is None else asdict(summary))}
                _write(self._entry_path(election, "runsum", entry), json.dumps(kept))
                if stored is not None:
                    del runs[key]
                    _write(self._path(election, "runs"), json.dumps(runs))
            return won, now_stored

    def runs_of(self, election: str, entry: str, limit: int) -> list[tuple[str, str]]:
        book = EntryBook.from_json(_read_json(self._entry_path(election, "run", entry)))
        return book.newest(time.time(), limit)

    def run_summaries(self, election: str) -> list[RunSummary]:
        prefix = f"{self.key_prefix}.{election}.runsum."
        out = []
        now = time.time()
        with _io(self.directory):
            paths = sorted(self.directory.glob(f"{_glob_escape(prefix)}*"))
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
        return self._path(election, f"{kind}.{quote(entry, safe='')}")

    @contextmanager
    def _runs_locked(self, election: str) -> Iterator[None]:
        path = self._path(election, "runs.lock")
        with _io(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            with _io(path):
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _live_runs(self, election: str) -> dict[str, tuple[str, float]]:
        # Unreadable content is dropped: records are kept for visibility and
        # deduplication, never for schedule state.
        data = _read_json(self._path(election, "runs"))
        now = time.time()
        if not isinstance(data, dict):
            return {}
        return {
            key: (str(item[0]), float(item[1]))
            for key, item in data.items()
            if isinstance(item, list) and len(item) == 2 and float(item[1]) > now
        }
    def entries_version(self, election: str) -> int:
        path = self._path(election, "entries")
        with _io(path):
            try:
                with path.open("rb") as f:
                    head = _HEAD.match(f.read(64))
            except FileNotFoundError:
                return 0
        return int(head.group(1)) if head else self.load_entries(election)[0]

    def load_entries(self, election: str) -> tuple[int, dict[str, str]]:
        path = self._path(election, "entries")
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

    def entries_changed_since(
        self, election: str, version: int
    ) -> tuple[int, dict[str, str | None]] | None:
        # The version first: the changes file is written after the entries, so
        # one behind it is being written (or was not, by a previous release or
        # an editor that died in between): read everything then.
        now = self.entries_version(election)
        if now == version:
            return now, {}
        changes = self._changes(election)
        if now < version or changes is None or changes[0] < now or changes[1] > version:
            return None
        return changes[0], {k: v for k, (at, v) in changes[2].items() if at > version}

    def _changes(self, election: str) -> tuple[int, int, dict[str, list[Any]]] | None:
        """The changes file: (its version, the oldest version it answers from, edits)."""
        data = _read_json(self._path(election, "entries-changes"))
        try:
            return int(data["version"]), int(data["from"]), dict(data["edits"])
        except (TypeError, KeyError, ValueError):
            return None  # none yet, or not ours: readers read everything

    def edit_entries(self, election: str, edits: Sequence[Edit]) -> list[bool]:
        lock_path = self._path(election, "entries-lock")
        with _io(lock_path):
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                # Editors of one host take turns; the files are replaced atomically,
                # so a leader reading them needs no lock.
                fcntl.flock(fd, fcntl.LOCK_EX)
                version, entries = self.load_entries(election)
                results = apply_edits(entries, edits)
                if any(results):
                    text = json.dumps({"version": version + 1, "entries": entries})
                    _write(self._path(election, "entries"), text)
                    _write(
                        self._path(election, "entries-changes"),
                        json.dumps(self._recorded(election, version, entries, edits, results)),
                    )
                return results
            finally:
                os.close(fd)

    def _recorded(
        self,
        election: str,
        version: int,
        entries: dict[str, str],
        edits: Sequence[Edit],
        results: list[bool],
    ) -> dict[str, Any]:
        """The changes file after the edits that moved the entries from ``version``."""
        changes = self._changes(election)
        if changes is None or changes[0] != version:
            # It does not reach this version: readers from before it read everything.
            start, kept = version, {}
        else:
            start, kept = changes[1], changes[2]
        for edit, applied in zip(edits, results, strict=True):
            if applied:
                kept.pop(edit.key, None)  # to the end: the dict stays oldest first
                kept[edit.key] = [version + 1, entries.get(edit.key)]
        while len(kept) > CHANGES_KEPT:
            start = max(start, kept.pop(next(iter(kept)))[0])
        return {"version": version + 1, "from": start, "edits": kept}

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


def _glob_escape(text: str) -> str:
    """``text`` matched literally by :meth:`Path.glob`."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def _write(path: Path, text: str) -> None:
    """Replace ``path`` atomically, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
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
