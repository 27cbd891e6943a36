"""What the leader knows of the entries kept in the store, re-read only when they change.

One cheap question a tick (the election's entries version); a record that cannot be
read is logged once and left out, and an unreachable store keeps the entries last read.
Run-now requests, kept among the entries, are held apart: an edit of requests alone
leaves the entries as they were.
"""

from __future__ import annotations

import logging
import time

from ..backends import EntryStore
from ..exceptions import StoreUnavailable
from .entries import Entry, EntryError
from .run_request import is_request

#: How often the leader asks whether the entries changed (one cheap store call): the
#: bound on how long an edit goes unnoticed. Schedulers wake at least this often.
POLL_INTERVAL = 0.5


class EntryFeed:
    """The entries of one election, as last read from the store."""

    def __init__(
        self,
        entries: EntryStore,
        election: str,
        logger: logging.Logger,
        interval: float | None = None,
    ) -> None:
        self.store = entries
        self.election = election
        self.logger = logger
        self.interval = POLL_INTERVAL if interval is None else interval
        self._asked = float("-inf")  # time.monotonic() of the last question
        self._version: int | None = None
        self._entries: dict[str, Entry] = {}
        self._texts: dict[str, str] = {}
        self._requests: dict[str, str] = {}  # run-now requests, by key
        self._warned: set[str] = set()
        #: Set while a follower keeps its jobs made: a store it cannot reach is then
        #: logged at DEBUG only, since the follower's lease already reports it.
        self.quiet = False

    def current(self) -> dict[str, Entry]:
        """The entries by name (store entries and kept pauses of code entries)."""
        now = time.monotonic()
        if now - self._asked < self.interval:
            return self._entries
        self._asked = now
        try:
            version = self.store.version(self.election)
            if version != self._version:
                self._version = self._read(version)
            self._warned.discard("")
        except StoreUnavailable as exc:
            if self.quiet:
                self.logger.debug("celery-leader: cannot read schedule entries: %s", exc)
            elif "" not in self._warned:
                self._warned.add("")
                self.logger.warning(
                    "celery-leader: cannot read schedule entries (keeping the last read): %s", exc
                )
        return self._entries

    def requests(self) -> dict[str, str]:
        """The run-now requests (key -> stored text), as last read with the entries."""
        self.current()
        return self._requests

    def _read(self, version: int) -> int:
        """Read what changed since the entries last read; the version now read."""
        changed = None
        if self._version is not None:
            changed = self.store.changes_since(self.election, self._version)
        if changed is None:
            version, texts = self.store.load(self.election)
            requests = {k: t for k, t in texts.items() if is_request(k)}
            if requests:
                texts = {k: t for k, t in texts.items() if not is_request(k)}
            if requests != self._requests:
                self._requests = requests
            if texts != self._texts:
                self._take(texts)
            return version
        version, edits = changed
        asked = {k: t for k, t in edits.items() if is_request(k)}
        if asked:
            requests = dict(self._requests)
            for key, text in asked.items():
                if text is None:
                    requests.pop(key, None)
                else:
                    requests[key] = text
            self._requests = requests
            edits = {k: t for k, t in edits.items() if not is_request(k)}
        if edits:
            entries, texts = dict(self._entries), dict(self._texts)
            for name, text in edits.items():
                entries.pop(name, None)
                texts.pop(name, None)
                if text is not None:
                    texts[name] = text
                    if (entry := self._parse(name, text)) is not None:
                        entries[name] = entry
            self._entries, self._texts = entries, texts
        return version

    def _take(self, texts: dict[str, str]) -> None:
        entries = {}
        for name, text in texts.items():
            if self._texts.get(name) == text and name in self._entries:
                entries[name] = self._entries[name]  # unchanged: not parsed again
            elif (entry := self._parse(name, text)) is not None:
                entries[name] = entry
        self._entries, self._texts = entries, texts

    def _parse(self, name: str, text: str) -> Entry | None:
        try:
            return Entry.from_json(text)
        except EntryError as exc:
            if text not in self._warned:
                self._warned.add(text)
                self.logger.error("celery-leader: skipping stored entry %s: %s", name, exc)
            return None
