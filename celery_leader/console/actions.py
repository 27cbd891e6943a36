"""The console's actions: pause, resume, bulk pause and run now, through the same
Python API as ``leader entries`` (:class:`~celery_leader.cli.entries.ScheduleEntries`),
so the page, the CLI and the API change an entry alike, and the API keeps each
change in the audit trail with who made it and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..cli.entries import EntriesApp, ScheduleEntries
from ..schedule.run_request import RunResult

#: Seconds a run now waits for the leader's answer before the page says "queued"
#: (the leader still runs it when it gets to it).
RUN_WAIT = 2.0
#: The most entries one bulk pause names.
MAX_BULK = 500
#: The longest reason kept.
MAX_REASON = 500


class ActionError(Exception):
    """An action refused: ``str(self)`` is the line the page shows."""


@dataclass(frozen=True)
class Actor:
    """Who asks for a change, as the audit trail names them."""

    who: str
    why: str | None = None


def reason(text: str | None) -> str:
    """A pause's reason, required: one line, at most :data:`MAX_REASON` characters."""
    why = " ".join((text or "").split())
    if not why:
        raise ActionError("a pause needs a reason")
    return why[:MAX_REASON]


class Actions:
    """The actions on the entries of ``app``."""

    def __init__(self, app: EntriesApp) -> None:
        self.app = app

    def pause(
        self, names: Sequence[str], actor: Actor, until: datetime | str | None = None
    ) -> list[str]:
        """Pause each of ``names`` (store or code entries), until resumed or until
        ``until``; returns those paused."""
        if not names:
            raise ActionError("no entry named")
        if len(names) > MAX_BULK:
            raise ActionError(f"a bulk pause names at most {MAX_BULK} entries")
        done = []
        with ScheduleEntries(self.app) as entries:
            for name in names:
                entries.pause(name, why=actor.why, until=until or None, who=actor.who)
                done.append(name)
        return done

    def resume(self, name: str, actor: Actor) -> None:
        """Resume ``name``: it is sent again from now."""
        with ScheduleEntries(self.app) as entries:
            entries.resume(name, actor.why, who=actor.who)

    def run_now(self, name: str, actor: Actor, key: str | None = None) -> RunResult:
        """Ask the leader for one run of store entry ``name`` now, under its term, and
        wait up to :data:`RUN_WAIT` seconds for its answer. ``key``: the idempotency
        key the page's form carries, so a form sent twice runs once. A code entry is
        refused: the page pauses and resumes code entries, nothing more."""
        if name in self.app.code:
            raise ActionError(f"{name} is a code entry: the console only pauses and resumes it")
        with ScheduleEntries(self.app) as entries:
            return entries.run_now(name, key=key, wait=RUN_WAIT, who=actor.who, why=actor.why)
