"""The Dramatiq scheduler: every replica runs one, only the beat election's leader sends.

The slot protocol (:mod:`celery_leader.schedule`) does everything as for Celery beat;
this module maps actors onto it and enqueues a claimed slot.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from ..exceptions import ConfigError
from ..probes import metrics
from ..schedule.catalog import EntryCatalog, kept_pause, policy
from ..schedule.entries import Entry
from ..schedule.jobs import NOT_CONNECTED, Adapter, Job, Outcome, caused_by
from ..schedule.protocol import SlotProtocol
from ..settings.config import LeaderConfig
from .schedules import Schedule

logger = logging.getLogger(__name__)

#: Longest sleep of the loop: how long a promotion or a dead parent goes
#: unnoticed (a stop request is noticed at once).
INTERVAL = 0.05


def entries_of(broker: Any, config: LeaderConfig) -> list[Job]:
    """The entries of every actor declared on ``broker`` with a ``leader_schedule``."""
    entries: dict[str, Job] = {}
    for actor in broker.actors.values():
        for schedule in schedules_of(actor.options.get("leader_schedule")):
            name = schedule.name or actor.actor_name
            if name in entries:
                raise ConfigError(
                    f"two leader_schedule entries are named {name!r}: give one of them name="
                )
            missed, grace = policy(config, schedule.missed_slots, schedule.missed_slots_grace)
            entries[name] = Job(name, schedule, missed, grace, payload=actor)
    return list(entries.values())


def refused_options(broker: Any) -> dict[str, str]:
    """The entry options ``broker`` cannot honour, each with the one-line reason: an option
    silently ignored would send another message than the entry describes."""
    refused = {
        "priority": "Dramatiq has no per-message priority (it is an actor option)",
        "headers": "Dramatiq messages have no headers",
    }
    if not any(type(m).__name__ == "AgeLimit" for m in broker.middleware):
        refused["expires"] = "this broker has no AgeLimit middleware to expire messages"
    return refused


def entry_message(
    actor: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any],
    **extra: Any,
) -> Any:
    """``actor``'s message for an entry, with its honoured ``options`` applied."""
    if "expires" in options:
        extra["max_age"] = int(options["expires"] * 1000)  # AgeLimit counts milliseconds
    message = actor.message_with_options(args=tuple(args), kwargs=dict(kwargs), **extra)
    if "queue" in options:
        message = message.copy(queue_name=options["queue"])
    return message


def schedules_of(value: object) -> list[Schedule]:
    """``leader_schedule`` as a list; anything but cron()/every() or a list of them fails."""
    if value is None:
        return []
    items = value if isinstance(value, list | tuple) else [value]
    for item in items:
        if not isinstance(item, Schedule):
            raise ConfigError(
                f"leader_schedule must be cron(...), every(...) or a list of them (got {item!r})"
            )
    return list(items)


class _EnqueueAdapter(Adapter):
    """Dramatiq's entries and enqueue, as the slot protocol sees them."""

    def __init__(self, broker: Any, config: LeaderConfig) -> None:
        self.broker = broker
        self.entries = entries_of(broker, config)
        unhonoured = refused_options(broker)

        def refusal(entry: Entry) -> str | None:
            if entry.task not in broker.actors:
                return f"no actor {entry.task} is declared"
            option = min(set(entry.options) & set(unhonoured), default=None)
            return None if option is None else f"its option {option}: {unhonoured[option]}"

        self.catalog = EntryCatalog(config, logger, "actor", refusal)
        self._names = frozenset(job.name for job in self.entries)
        #: Code entries' jobs as last made (those not paused).
        self._code: list[Job] = []
        #: What the last :meth:`jobs` returned (``None``: nothing yet), made again
        #: first when edits were taken since (``_stale``).
        self._made: list[Job] | None = None
        self._stale = False

    def jobs_changed(self) -> bool:
        """Code entries are fixed at start-up: only the store's entries change."""
        return self._made is None or self.catalog.changed()

    def jobs(self) -> Sequence[Job]:
        # Made before: only the store's entries (and kept pauses) change, their edits
        # taken, costing what changed (see the Celery adapter's ``jobs``).
        if self._made is not None and (not self.jobs_changed() or self.job_edits() is not None):
            if self._stale:  # edits were taken since it was made
                self._made, self._stale = self._code + self.catalog.stored_jobs(), False
            return self._made
        records = self.catalog.read()
        now = self.catalog.now()
        self._code = self._code_jobs(records, now)
        self._made, self._stale = self._code + self.catalog.jobs(records, self._names), False
        return self._made

    def jobs_complete(self) -> bool:
        return not self.catalog.loading()

    def job_edits(self) -> Mapping[str, Job | None] | None:
        """The jobs of the store's records that changed, and of code entries whose kept
        pause did; the others untouched."""
        if self._made is None:
            return None
        names, edits = self.catalog.job_edits(self._names)
        code = names & self._names
        if code:
            records, now = self.catalog.last_read(), self.catalog.now()
            before = {job.name: job for job in self._code}
            self._code = self._code_jobs(records, now)
            after = {job.name: job for job in self._code}
            for name in code:
                if after.get(name) is not before.get(name):
                    edits[name] = after.get(name)
        if edits:
            self._stale = True
        return edits

    def _code_jobs(self, records: dict[str, Entry], now: datetime) -> list[Job]:
        """The code entries as they may run at ``now`` (the paused left out)."""
        jobs = []
        for job in self.entries:
            enabled, since = kept_pause(records, job.name, now)
            if enabled:
                jobs.append(job if since == job.active_since else replace(job, active_since=since))
        return jobs

    def run_requests(self) -> Mapping[str, str]:
        return self.catalog.requests()

    def run_job(self, name: str) -> Job | str:
        """A code entry's job (paused or not), else a store entry's, as the catalog
        allows it."""
        for job in self.entries:
            if job.name == name:
                return job
        return self.catalog.run_job(name, self._names)

    def send(self, job: Job, slot: str, due: datetime, epoch: int) -> Outcome:
        if isinstance(job.payload, Entry):  # a store entry's
            entry = job.payload
            actor = self.broker.actors[entry.task]
            args, kwargs, options = tuple(entry.args), dict(entry.kwargs), entry.options
        else:
            schedule = job.series
            assert isinstance(schedule, Schedule)
            actor, args, kwargs, options = job.payload, schedule.args, schedule.kwargs, {}
        message = entry_message(actor, args, kwargs, options, leader_epoch=epoch, leader_slot=slot)
        try:
            self.broker.enqueue(message)
        except Exception as exc:
            return Outcome(exc, caused_by(exc, NOT_CONNECTED))
        return Outcome()

    def expired(self, job: Job, age: float) -> bool:
        if isinstance(job.payload, Entry):  # expires is refused where AgeLimit is missing
            expires = job.payload.options.get("expires")
            return expires is not None and bool(age >= expires)
        # The actor's own max_age (milliseconds), which Dramatiq's AgeLimit enforces.
        max_age = job.payload.options.get("max_age")
        return max_age is not None and bool(age * 1000 >= max_age)


def leader_jobs(broker: Any, config: LeaderConfig) -> Sequence[Job]:
    """The entries a leader of ``broker`` would send (``plan --stored``), reading the store
    once on a connection of its own."""
    adapter = _EnqueueAdapter(broker, config)
    return adapter.catalog.read_once(adapter.jobs)


class DramatiqScheduler:
    """Sends the due slots of ``broker``'s scheduled actors while it leads the beat election."""

    def __init__(self, broker: Any, config: LeaderConfig) -> None:
        self.config = config
        self.adapter = _EnqueueAdapter(broker, config)
        observers = (metrics.OBSERVER,)
        self.protocol = SlotProtocol(
            config, self.adapter, logger, idle=INTERVAL, max_sleep=INTERVAL, observers=observers
        )

    def run(self, stop: threading.Event, parent_pid: int | None = None) -> None:
        """Schedule until ``stop`` is set (or the parent process dies), then hand over."""
        logger.info(
            "celery-leader: Dramatiq scheduler %s joins %r at %s with %d entries: %s",
            self.config.instance_id,
            self.config.beat_election,
            self.config.display_url,
            len(self.adapter.entries),
            ", ".join(f"{e.name} {e.series!r}" for e in self.adapter.entries) or "none",
        )
        try:
            while not stop.is_set():
                if parent_pid is not None and os.getppid() != parent_pid:
                    logger.warning("celery-leader: Dramatiq main process died; scheduler exits")
                    break
                stop.wait(self.tick())
        finally:
            # Demote, release and wake a follower before anything else.
            self.protocol.close()

    def tick(self) -> float:
        """One pass of the loop; returns how long to sleep. While following it keeps the jobs
        of changed store entries made, so a promotion only loads run state."""
        lease = self.protocol.lease
        catalog = self.adapter.catalog
        catalog.follow(self.protocol.runtime.store.entries, lease.term is None, self.adapter)
        sleep = self.protocol.tick()
        return 0.0 if catalog.loading() and lease.term is not None else sleep
