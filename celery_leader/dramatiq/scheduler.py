"""The Dramatiq scheduler: every replica runs one, only the beat election's leader sends.

Each ``leader_schedule`` of a declared actor is an entry, and the slot protocol
(:mod:`celery_leader.schedule`) does the rest exactly as for Celery beat: stored
state, fenced claims, the missed-slot policy, hand-back of a failed enqueue,
step-down after repeated failures, the tick watchdog, health file and metrics.
This module only maps actors onto it and enqueues a claimed slot.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from .. import metrics
from ..backends import open_store
from ..config import LeaderConfig
from ..exceptions import ConfigError
from ..schedule.entries import CODE, STORE, Entry, allowed
from ..schedule.feed import EntryFeed
from ..schedule.jobs import NOT_CONNECTED, Adapter, Job, Outcome, caused_by
from ..schedule.protocol import SlotProtocol
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
            entries[name] = Job(
                name,
                schedule,
                schedule.missed_slots or config.missed_slots,
                schedule.missed_slots_grace
                if schedule.missed_slots_grace is not None
                else config.missed_slots_grace,
                payload=actor,
            )
    return list(entries.values())


def refused_options(broker: Any) -> dict[str, str]:
    """The entry options ``broker`` cannot honour, each with the one-line reason.

    ``queue`` is honoured (the message goes to that queue) and ``expires`` too
    when the broker runs Dramatiq's ``AgeLimit`` (it reads the message's
    ``max_age``); the rest have no per-message equal, and an option silently
    ignored would send a message other than the one the entry describes.
    """
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

    def __init__(self, broker: Any, entries: list[Job], config: LeaderConfig) -> None:
        self.broker = broker
        self.entries = entries
        self.config = config
        #: The entries kept in the store; set once the scheduler has its lease.
        self.feed: EntryFeed | None = None
        self._refused: set[tuple[str, str]] = set()  # (name, why) logged once
        self._unhonoured = refused_options(broker)
        #: What the last :meth:`jobs` listed from: the feed and the entries it had read.
        self._listed: tuple[EntryFeed | None, dict[str, Entry] | None] | None = None
        #: Store entries' jobs, by name, with the Entry each was made of: an unchanged
        #: entry keeps its job.
        self._stored: dict[str, tuple[Entry, Job]] = {}
        #: What the last :meth:`jobs` returned: returned again while nothing changed
        #: (a promotion of a follower that kept them made).
        self._made: Sequence[Job] = ()

    def jobs_changed(self) -> bool:
        """Code entries are fixed at start-up: only the store's entries change."""
        if self._listed is None:
            return True
        feed, records = self._listed
        return self.feed is not feed or (feed is not None and feed.current() is not records)

    def jobs(self) -> Sequence[Job]:
        if self._listed is not None and not self.jobs_changed():
            return self._made
        self._made = self._list()
        return self._made

    def _list(self) -> Sequence[Job]:
        if self.feed is None:
            self._listed = (None, None)
            return self.entries
        records = self.feed.current()
        self._listed = (self.feed, records)
        jobs = []
        for job in self.entries:
            kept = records.get(job.name)
            if kept is not None and kept.kind == CODE:
                if not kept.enabled:
                    continue  # paused from the CLI or the API
                # Resumed: nothing for the paused time.
                job = replace(job, active_since=kept.active_since)
            jobs.append(job)
        code = {j.name for j in self.entries}
        stored: dict[str, tuple[Entry, Job]] = {}
        for name, entry in records.items():
            actor = self.broker.actors.get(entry.task)
            known = self._stored.get(name)
            # The feed keeps an unedited entry's object: checked when first listed,
            # so a list after one edit of a large schedule costs a lookup per entry.
            if (
                known is not None
                and known[0] is entry
                and known[1].payload[0] is actor
                and name not in code
            ):
                stored[name] = known
                jobs.append(known[1])
                continue
            if entry.kind != STORE or not entry.enabled:
                continue
            # Written by a Celery app or an older tool: refused, never half-sent.
            unhonoured = sorted(set(entry.options) & set(self._unhonoured))
            why = (
                "a code entry has its name; the code entry runs"
                if name in code
                else f"its actor {entry.task} is outside leader_entries_allow"
                if not allowed(entry.task, self.config.entries_allow)
                else f"no actor {entry.task} is declared"
                if actor is None
                else f"its option {unhonoured[0]}: {self._unhonoured[unhonoured[0]]}"
                if unhonoured
                else None
            )
            if why is not None:
                if (name, why) not in self._refused:
                    self._refused.add((name, why))
                    logger.error("celery-leader: not sending stored entry %s: %s", name, why)
                continue
            if known is None or known[0] != entry or known[1].payload[0] is not actor:
                known = (
                    entry,
                    Job(
                        name,
                        entry.series(),
                        entry.missed_slots or self.config.missed_slots,
                        entry.missed_slots_grace
                        if entry.missed_slots_grace is not None
                        else self.config.missed_slots_grace,
                        payload=(actor, entry),
                        generation=entry.generation,
                        active_since=entry.active_since,
                    ),
                )
            stored[name] = known
            jobs.append(known[1])
        self._stored = stored
        return jobs

    def send(self, job: Job, slot: str, due: datetime, epoch: int) -> Outcome:
        if isinstance(job.payload, tuple):  # a store entry: (its actor, the Entry)
            actor, entry = job.payload
            assert isinstance(entry, Entry)
            args, kwargs = tuple(entry.args), dict(entry.kwargs)
            options = entry.options
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


def leader_jobs(broker: Any, config: LeaderConfig) -> Sequence[Job]:
    """The entries a leader of ``broker`` would send: its code entries (less those
    paused) and the store entries it honours (``plan --stored`` lists them). Reads
    the store once, on a connection of its own."""
    adapter = _EnqueueAdapter(broker, entries_of(broker, config), config)
    store = open_store(config)
    try:
        adapter.feed = EntryFeed(store.entries, config.beat_election, logger, interval=0)
        return adapter.jobs()
    finally:
        store.close()


class DramatiqScheduler:
    """Sends the due slots of ``broker``'s scheduled actors while it leads the beat election."""

    def __init__(self, broker: Any, config: LeaderConfig) -> None:
        self.broker = broker
        self.config = config
        self.entries = entries_of(broker, config)
        self.adapter = _EnqueueAdapter(broker, self.entries, config)
        self.protocol = SlotProtocol(
            config,
            self.adapter,
            logger,
            idle=INTERVAL,
            max_sleep=INTERVAL,
            observers=(metrics.OBSERVER,),
        )

    def run(self, stop: threading.Event, parent_pid: int | None = None) -> None:
        """Schedule until ``stop`` is set (or the parent process dies), then hand over."""
        logger.info(
            "celery-leader: Dramatiq scheduler %s joins %r at %s with %d entries: %s",
            self.config.instance_id,
            self.config.beat_election,
            self.config.display_url,
            len(self.entries),
            ", ".join(f"{e.name} {e.series!r}" for e in self.entries) or "none",
        )
        lease = self.protocol.lease
        self.adapter.feed = EntryFeed(self.protocol.runtime.store.entries, lease.election, logger)
        # The store entries' jobs are made before joining the election: seconds at
        # 100,000 entries that would otherwise run out a new leader's tick timeout.
        self.adapter.jobs()
        lease.start()
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
        """One pass of the loop; returns how long to sleep.

        A follower keeps the jobs of the store's entries made (one version check
        per ``POLL_INTERVAL``, a re-read only after an edit), so a promotion only
        loads run state; only a leader dispatches.
        """
        following = self.protocol.lease.term is None
        if self.adapter.feed is not None:
            self.adapter.feed.quiet = following
        if following and self.adapter.jobs_changed():
            self.adapter.jobs()
        return self.protocol.tick()
