"""Edits of the schedule entries kept in the store, from any process, without a lease.

Every edit is one compare-and-set of the entry's JSON, so two editors never silently
overwrite each other: the loser re-reads and, unless it named the version it read,
applies its change again. Code entries cannot be removed; their pause is a ``"code"`` record.
Each edit made is recorded in the audit trail (:mod:`.audit`): who (``who=``, else the
book's actor), when, what and why (``why=``); a trail that cannot be written leaves the
edit made and says so in one warning line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from ..backends import Edit, EntryStore, Journal
from ..backends.errors import summarise
from .audit import AuditRecord, local_actor, record_change
from .entries import STORE, Entry, EntryError, code_pause, instant_now, new_entry, pause_end
from .run_request import is_request

logger = logging.getLogger(__name__)

#: Tries of an edit that lost a compare-and-set to another editor.
_TRIES = 20


class EntryConflict(EntryError):
    """The entry is not what the edit expected (it exists, or another edit came first)."""


class EntryNotFound(EntryError):
    """No entry of that name."""


class EntryBook:
    """The schedule entries of one election (see the module docstring).

    ``journal``: where the audit trail is kept, each log its newest ``keep``
    records (``None``: nowhere); ``actor``: who edits when an edit names no one
    (default :func:`~.audit.local_actor`); ``warn``: says a line (default: a
    logged warning).
    """

    def __init__(
        self,
        entries: EntryStore,
        election: str,
        code: Collection[str] = (),
        now: Callable[[], datetime] = instant_now,
        journal: Journal | None = None,
        actor: str | None = None,
        keep: int = 10_000,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.store = entries
        self.election = election
        #: Names of the code entries of the app: they cannot be added or removed here.
        self.code = frozenset(code)
        self._now = now
        self.journal = journal
        self.actor = actor or local_actor()
        self.keep = keep
        self._warn = warn or (lambda line: logger.warning("celery-leader: %s", line))

    def list(self) -> list[Entry]:
        """Every record, by name: store entries and the kept pauses of code entries."""
        _, records = self.store.load(self.election)
        return [entry for _, entry in sorted(_read_all(records).items())]

    def get(self, name: str) -> Entry | None:
        """The record named ``name``, or ``None``."""
        return self._read(name)[0]

    def add(
        self,
        replace: bool = False,
        *,
        why: str | None = None,
        who: str | None = None,
        imported: bool = False,
        **fields: Any,
    ) -> Entry:
        """Add a store entry; refused when the name is a code entry's, or exists and not
        ``replace`` (a replaced entry keeps its generation). ``imported``: the trail
        says ``import`` rather than ``add``."""
        entry, before = self._add(replace, fields)
        details: dict[str, Any] = {"task": entry.task, "schedule": entry.schedule_text}
        if before is not None:
            details["fields"] = _changed(before, entry)
        action = "import" if imported else "add" if before is None else "update"
        self.record(entry.name, action, why, who, details)
        return entry

    def _add(self, replace: bool, fields: dict[str, Any]) -> tuple[Entry, Entry | None]:
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
                    return entry, None
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
                return edited, current
        raise _busy(entry.name)

    def update(
        self,
        name: str,
        expected_version: int | None = None,
        *,
        why: str | None = None,
        who: str | None = None,
        **changes: Any,
    ) -> Entry:
        """Change fields of store entry ``name``; with ``expected_version``, only if
        it still has that version (else :class:`EntryConflict`)."""
        before, entry = self._change(
            name, expected_version, lambda e: e.edited(self._now(), **changes)
        )
        self.record(name, "update", why, who, {"fields": _changed(before, entry)})
        return entry

    def remove(
        self,
        name: str,
        expected_version: int | None = None,
        *,
        why: str | None = None,
        who: str | None = None,
    ) -> Entry:
        """Remove store entry ``name``; returns what was removed. A code entry
        cannot be removed (pause it)."""
        removed = self._remove(name, expected_version)
        details = {"task": removed.task, "schedule": removed.schedule_text}
        self.record(name, "remove", why, who, details)
        return removed

    def _remove(self, name: str, expected_version: int | None) -> Entry:
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

    def pause(
        self,
        name: str,
        why: str | None = None,
        until: datetime | str | None = None,
        *,
        who: str | None = None,
    ) -> Entry:
        """Stop sending ``name`` (a store or a code entry) until :meth:`resume`, or
        until ``until`` (an aware datetime or ISO 8601; naive means UTC), when it
        runs again by itself: nothing is sent for the time it was paused either way.
        The entry keeps who paused it, why and until when."""
        end = pause_end(name, until, self._now())
        by = who or self.actor
        pause = {"paused_by": by, "paused_why": why, "paused_until": end}
        entry = self._set_enabled(name, False, pause)
        details = {} if end is None else {"until": end.isoformat()}
        self.record(name, "pause", why, by, details)
        return entry

    def resume(self, name: str, why: str | None = None, *, who: str | None = None) -> Entry:
        """Send ``name`` again, from now: nothing for the time it was paused."""
        entry = self._set_enabled(name, True, {})
        self.record(name, "resume", why, who)
        return entry

    def record(
        self,
        name: str,
        action: str,
        why: str | None = None,
        who: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """Add a change made to ``name`` to the audit trail (the edits do it
        themselves; a run sent now is recorded by its sender). A trail that cannot
        be written is one warning line: the change stays made."""
        if self.journal is None:
            return
        at = self._now().timestamp()
        change = AuditRecord(at, who or self.actor, action, name, why, details or {})
        try:
            record_change(self.journal, self.election, change, self.keep)
        # Whatever failed, the change is made: neither undone nor hidden by an error.
        except Exception as exc:
            self._warn(
                f"{name}: {action} done, but the audit trail did not record it: "
                f"{summarise(exc)}"
            )

    def _set_enabled(self, name: str, enabled: bool, pause: dict[str, Any]) -> Entry:
        if name in self.code:
            for _ in range(_TRIES):
                current, text = self._read(name)
                record = code_pause(name, self._now(), enabled, current, **pause)
                if self._edit(Edit(name, text, record.to_json())):
                    return record
            raise _busy(name)

        def change(entry: Entry) -> Entry:
            return entry.edited(self._now(), enabled=enabled, **pause)

        return self._change(name, None, change)[1]

    def _change(
        self, name: str, expected_version: int | None, change: Callable[[Entry], Entry]
    ) -> tuple[Entry, Entry]:
        """The entry before and after ``change``, applied by compare-and-set."""
        for _ in range(_TRIES):
            current, text = self._read(name)
            if current is None or current.kind != STORE:
                raise EntryNotFound(f"no entry {name} in the store")
            _check_version(current, expected_version)
            edited = change(current)
            if self._edit(Edit(name, text, edited.to_json())):
                return current, edited
        raise _busy(name)

    def _read(self, name: str) -> tuple[Entry | None, str | None]:
        text = self.store.load_one(self.election, name)
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


def _changed(before: Entry, after: Entry) -> list[str]:
    """The names of the fields an edit changed (not their values: args and kwargs
    may hold what the trail's readers should not see)."""
    moved = ("version", "active_since")
    return [
        k for k in Entry.__dataclass_fields__
        if k not in moved and getattr(before, k) != getattr(after, k)
    ]


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
