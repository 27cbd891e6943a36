"""The Dramatiq scheduler: every replica runs one, only the beat election's leader sends.

Each ``leader_schedule`` of a declared actor is an entry. The leader keeps each
entry's run state (the due time of the last slot sent) in the lease store, as
beat does, so a new leader continues where the previous one stopped:

* On promotion it loads the stored state; an entry with none is anchored at now
  with a claim, so its first slot is the next one after the promotion.
* Before sending, it claims each due slot with one fenced compare-and-set
  ("my term is current and the entry's state is the one I read"). Only a
  claimed slot is sent, so a paused or cut-off ex-leader sends nothing.
* Slots missed while nobody led are folded into one send, named after the
  latest of them.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..backends import Backend, Claim, create_backend
from ..config import LeaderConfig
from ..exceptions import ConfigError, StoreUnavailable
from ..lease import Lease
from ..schedule.state import dump_state, parse_state, slot_name
from .schedules import Schedule

logger = logging.getLogger("celery_leader.dramatiq.scheduler")

#: Longest sleep of the loop: how long a promotion, a lost lease, a stop
#: request or a dead parent goes unnoticed.
INTERVAL = 0.05


@dataclass
class Entry:
    """One schedule of one actor, and the due time of its next slot."""

    name: str
    actor: Any  # dramatiq.Actor
    schedule: Schedule
    next_due: datetime | None = None
    count: int = 0


def entries_of(broker: Any) -> list[Entry]:
    """The entries of every actor declared on ``broker`` with a ``leader_schedule``."""
    entries: dict[str, Entry] = {}
    for actor in broker.actors.values():
        for schedule in schedules_of(actor.options.get("leader_schedule")):
            name = schedule.name or actor.actor_name
            if name in entries:
                raise ConfigError(
                    f"two leader_schedule entries are named {name!r}: give one of them name="
                )
            entries[name] = Entry(name, actor, schedule)
    return list(entries.values())


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


class DramatiqScheduler:
    """Sends the due slots of ``broker``'s scheduled actors while it leads the beat election."""

    def __init__(self, broker: Any, config: LeaderConfig) -> None:
        self.broker = broker
        self.config = config
        self.entries = entries_of(broker)
        self.backend: Backend = create_backend(config)
        self.lease = Lease.from_config(config.beat_election, config, self.backend)
        self._led_epoch: int | None = None
        self._shared: dict[str, str] = {}

    def run(self, stop: threading.Event, parent_pid: int | None = None) -> None:
        """Schedule until ``stop`` is set (or the parent process dies), then hand over."""
        logger.info(
            "celery-leader: Dramatiq scheduler %s joins %r at %s with %d entries: %s",
            self.config.instance_id,
            self.config.beat_election,
            self.config.display_url,
            len(self.entries),
            ", ".join(f"{e.name} {e.schedule!r}" for e in self.entries) or "none",
        )
        self.lease.start()
        try:
            while not stop.is_set():
                if parent_pid is not None and os.getppid() != parent_pid:
                    logger.warning("celery-leader: Dramatiq main process died; scheduler exits")
                    break
                stop.wait(self.tick())
        finally:
            # Demote, release and wake a follower before anything else.
            self.lease.stop()
            self.backend.close()

    def tick(self) -> float:
        """One pass; returns how long to sleep."""
        tenure = self.lease.tenure
        if tenure is None:
            if self._led_epoch is not None:
                logger.info("celery-leader: scheduler stopped sending: no longer leader")
                self._led_epoch = None
            return INTERVAL
        if tenure.epoch != self._led_epoch:
            try:
                self._load(tenure)
            except StoreUnavailable as exc:
                logger.warning("celery-leader: cannot load schedule state: %s", exc)
                return INTERVAL
            self._led_epoch = tenure.epoch
            logger.info("celery-leader: scheduler sending as leader (epoch %d)", tenure.epoch)
        now = datetime.now(timezone.utc)
        due = [e for e in self.entries if e.next_due is not None and e.next_due <= now]
        if due:
            self._send(due, now)
        upcoming = [e.next_due for e in self.entries if e.next_due is not None]
        if not upcoming:
            return INTERVAL
        return max(0.0, min(INTERVAL, (min(upcoming) - datetime.now(timezone.utc)).total_seconds()))

    def _load(self, tenure: Any) -> None:
        """Adopt the stored state of every entry; anchor (and claim) entries without one."""
        stored = self.backend.load_state(self.lease.election)
        self._shared = dict(stored)
        now = datetime.now(timezone.utc)
        anchors = []
        for entry in self.entries:
            raw = stored.get(entry.name)
            state = None if raw is None else parse_state(raw)
            if state is not None:
                last, entry.count = state
                entry.next_due = entry.schedule.next_after(last.astimezone(timezone.utc))
                continue
            if raw is not None:
                logger.error(
                    "celery-leader: unreadable schedule state of %r: %.100r (starting anew)",
                    entry.name,
                    raw,
                )
            new = dump_state(now, 0, tenure.epoch, self.lease.instance_id)
            anchors.append(Claim(entry.name, raw, new))
            entry.count = 0
            entry.next_due = entry.schedule.next_after(now)
        if anchors:
            won = self.backend.claim(self.lease.election, tenure, anchors)
            if not all(won):
                raise StoreUnavailable("the schedule state changed while loading it")
            self._shared.update((claim.entry, claim.new) for claim in anchors)

    def _send(self, due: list[Entry], now: datetime) -> None:
        tenure = self.lease.tenure
        if tenure is None:
            return
        plans = []
        for entry in due:
            assert entry.next_due is not None
            when = entry.schedule.latest_due(entry.next_due, now)
            slot = slot_name(entry.name, when)
            new = dump_state(when, entry.count + 1, tenure.epoch, self.lease.instance_id, slot)
            plans.append((entry, when, slot, Claim(entry.name, self._shared.get(entry.name), new)))
        try:
            won = self.backend.claim(self.lease.election, tenure, [p[3] for p in plans])
        except StoreUnavailable as exc:
            logger.warning("celery-leader: claims failed, nothing sent: %s", exc)
            self._led_epoch = None  # reload the state before trying again
            return
        for (entry, when, slot, claim), ok in zip(plans, won, strict=True):
            if not ok:
                logger.warning("celery-leader: slot %s not claimed; not sending it", slot)
                self._led_epoch = None
                continue
            self._shared[entry.name] = claim.new
            entry.count += 1
            entry.next_due = entry.schedule.next_after(when)
            self._enqueue(entry, slot, tenure.epoch)

    def _enqueue(self, entry: Entry, slot: str, epoch: int) -> None:
        schedule = entry.schedule
        message = entry.actor.message_with_options(
            args=schedule.args, kwargs=schedule.kwargs, leader_epoch=epoch, leader_slot=slot
        )
        try:
            self.broker.enqueue(message)
        except Exception as exc:
            # The slot stays claimed: it is not sent twice; the entry runs at its next slot.
            logger.error("celery-leader: could not send slot %s: %s", slot, exc, exc_info=True)
            return
        logger.info("celery-leader: sent %s slot %s epoch %d", entry.actor.actor_name, slot, epoch)
