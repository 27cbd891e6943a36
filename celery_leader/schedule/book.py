"""Edits of the schedule entries kept in the store, from any process, without a lease.

Every edit is one compare-and-set of the entry's JSON, so two editors never silently
overwrite each other: the loser re-reads and, unless it named the version it read,
applies its change again. Code entries cannot be removed; their pause is a ``"code"`` record.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from ..backends import Edit, EntryStore
from .entries import STORE, Entry, EntryError, code_pause, instant_now, new_entry
from .run_request import is_request

#: Tries of an edit that lost a compare-and-set to another editor.
_TRIES = 20


class EntryConflict(EntryError):
    """The entry is not what the edit expected (it exists, or another edit came first)."""


class EntryNotFound(EntryError):
    """No entry of that name."""


class EntryBook:
    """The schedule entries of one election (see the module docstring)."""

    def __init__(
        self,
        entries: EntryStore,
        election: str,
        code: Collection[str] = (),
        now: Callable[[], datetime] = instant_now,
    ) -> None:
        self.store = entries
        self.election = election
        #: Names of the code entries of the app: they cannot be added or removed here.
        self.code = frozenset(code)
        self._now = now

    def list(self) -> list[Entry]:
        """Every record, by name: store entries and the kept pauses of code entries."""
        _, records = self.store.load(self.election)
        return [entry for _, entry in sorted(_read_all(records).items())]

    def get(self, name: str) -> Entry | None:
        """The record named ``name``, or ``None``."""
        return self._read(name)[0]

    def add(self, replace: bool = False, **fields: Any) -> Entry:
        """Add a store entry; refused when the name is a code entry's, or exists and not
        ``replace`` (a replaced entry keeps its generation)."""
        name = fields.get("name")
        if name in self.code:
            raise EntryConflict(
                f"{name} is a code entry (beat_schedule / leader_schedule): pick another name"
            )
        entry = new_entry(self._now(), **fields)
        for _ in range(_TRIES):
            current, text = self._read(entry.name)
            if current is None:
                if self._edit(Edit(entry.name, None, entry.to_json())):
                    return entry
                continue
            if not replace:
                raise EntryConflict(f"entry {entry.name} exists: use --replace to redefine it")
            changes = {
                k: getattr(entry, k)
                for k in Entry.__dataclass_fields__
                if k not in ("name", "version", "generation", "active_since")
            }
            edited = current.edited(self._now(), **changes)
            if self._edit(Edit(entry.name, text, edited.to_json())):
                return edited
        raise _busy(entry.name)

    def update(self, name: str, expected_version: int | None = None, **changes: Any) -> Entry:
        """Change fields of store entry ``name``; with ``expected_version``, only if
        it still has that version (else :class:`EntryConflict`)."""
        return self._change(name, expected_version, lambda e: e.edited(self._now(), **changes))

    def remove(self, name: str, expected_version: int | None = None) -> Entry:
        """Remove store entry ``name``; returns what was removed. A code entry
        cannot be removed (pause it)."""
        if name in self.code:
            raise EntryError(
                f"{name} is a code entry: remove it from the code, or pause it instead"
            )
        for _ in range(_TRIES):
            current, text = self._read(name)
            if current is None:
                raise EntryNotFound(f"no entry {name} in the store")
            _check_version(current, expected_version)
            if self._edit(Edit(name, text, None)):
                return current
        raise _busy(name)

    def pause(self, name: str) -> Entry:
        """Stop sending ``name`` (a store or a code entry) until :meth:`resume`."""
        return self._set_enabled(name, False)

    def resume(self, name: str) -> Entry:
        """Send ``name`` again, from now: nothing for the time it was paused."""
        return self._set_enabled(name, True)

    def _set_enabled(self, name: str, enabled: bool) -> Entry:
        if name in self.code:
            for _ in range(_TRIES):
                current, text = self._read(name)
                record = code_pause(name, self._now(), enabled, current)
                if self._edit(Edit(name, text, record.to_json())):
                    return record
            raise _busy(name)
        return self._change(name, None, lambda e: e.edited(self._now(), enabled=enabled))

    def _change(
        self, name: str, expected_version: int | None, change: Callable[[Entry], Entry]
    ) -> Entry:
        for _ in range(_TRIES):
            current, text = self._read(name)
            if current is None or current.kind != STORE:
                raise EntryNotFound(f"no entry {name} in the store")
            _check_version(current, expected_version)
            edited = change(current)
            if self._edit(Edit(name, text, edited.to_json())):
                return edited
        raise _busy(name)

    def _read(self, name: str) -> tuple[Entry | None, str | None]:
        _, records = self.store.load(self.election)
        text = records.get(name)
        return (None if text is None else Entry.from_json(text)), text

    def _edit(self, edit: Edit) -> bool:
        (ok,) = self.store.edit(self.election, [edit])
        return ok


def _check_version(entry: Entry, expected: int | None) -> None:
    if expected is not None and entry.version != expected:
        raise EntryConflict(
            f"entry {entry.name} is at version {entry.version}, not {expected}: "
            "someone else changed it; read it again"
        )


def _busy(name: str) -> EntryConflict:
    return EntryConflict(f"entry {name} kept changing under {_TRIES} tries; try again")


def _read_all(records: dict[str, str]) -> dict[str, Entry]:
    """Every readable record; an unreadable one raises (an editor must not guess).
    Run-now requests, kept beside the entries, are not entries."""
    out = {}
    for name, text in records.items():
        if is_request(name):
            continue
        try:
            out[name] = Entry.from_json(text)
        except EntryError as exc:
            raise EntryError(f"stored entry {name} is unreadable: {exc}") from None
    return out
