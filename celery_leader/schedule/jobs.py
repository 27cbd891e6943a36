"""What the slot protocol knows of a schedule entry (:class:`Job`), and what an adapter
(Celery beat, the Dramatiq scheduler) provides (:class:`Adapter`)."""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from typing import Any

from .series import Series


@dataclass(frozen=True, slots=True)
class Job:
    """One schedule entry, as the slot protocol sees it."""

    name: str
    #: Its due instants; ``None`` when only the adapter can tell when it is due
    #: (Celery's solar and custom schedules): see :meth:`Adapter.due_now`.
    series: Series | None
    #: The missed-slot policy and grace of this entry (its own, else the settings).
    missed_slots: str
    grace: float | None
    #: The zone its slot names are written in.
    zone: tzinfo = timezone.utc
    #: The adapter's own entry (a Celery ``ScheduleEntry``, a Dramatiq actor ...).
    payload: Any = None
    #: One lifetime of the entry's definition; ``None``: the name is the identity.
    #: Stored state of another generation is not adopted: the entry starts anew.
    generation: str | None = None
    #: Aware UTC instant since which the entry has been enabled with its current
    #: schedule; ``None``: always. No slot due before it is sent, under any policy.
    active_since: datetime | None = None


@dataclass(frozen=True)
class Outcome:
    """How one publish went: ``error`` is ``None`` when the broker has the message;
    ``definitely_unsent``: none of it can have reached the broker (the slot is handed back)."""

    error: BaseException | None = None
    definitely_unsent: bool = False


class Adapter(ABC):
    """What a scheduler (Celery beat, Dramatiq) gives the slot protocol."""

    @abstractmethod
    def jobs(self) -> Sequence[Job]:
        """The entries of the schedule now (it may change between ticks)."""

    def jobs_changed(self) -> bool:
        """Whether :meth:`jobs` may now differ from what it returned last (asked again only
        then, and at each new term, so a tick costs what is due). By default always."""
        return True

    def jobs_complete(self) -> bool:
        """Whether :meth:`jobs` lists the whole schedule: False while the store's entries
        are still being read, page by page (what a new term does once everything is
        loaded waits for them). By default True."""
        return True

    def job_edits(self) -> Mapping[str, Job | None] | None:
        """The jobs that changed since :meth:`jobs` or this last answered (name -> its job
        now, ``None``: gone), so that an edit costs what it touched; ``None``: list them
        all with :meth:`jobs`. By default ``None``."""
        return None

    @abstractmethod
    def send(self, job: Job, slot: str, due: datetime, epoch: int) -> Outcome:
        """Publish slot ``slot`` (due at ``due``) of ``job``, fenced by ``epoch``; inside
        :meth:`publishing` it may be buffered (``Outcome()``), and :meth:`flush` tells."""

    def flush(self) -> Outcome:
        """Deliver what :meth:`send` buffered; the outcome holds for all of it."""
        return Outcome()

    def expired(self, job: Job, age: float) -> bool:
        """Whether a message of ``job`` published ``age`` seconds ago has expired (the
        entry's ``expires``): such a slot is not sent again. By default never."""
        return False

    def due_now(self, job: Job, now: datetime) -> tuple[datetime | None, float]:
        """For a job without a series: the due instant of its slot if one is due now
        (``now`` when the schedule cannot name one), and seconds until to ask again."""
        raise NotImplementedError(f"job {job.name!r} has no series and the adapter no due_now")

    def recorded(self, job: Job, last_run_at: datetime, count: int, sent: bool) -> None:  # noqa: B027
        """The store now records ``job`` as last run at ``last_run_at`` (``count`` runs);
        ``sent``: slots were sent just now. Celery keeps its entries' ``last_run_at`` in step."""

    def run_requests(self) -> Mapping[str, str]:
        """The run-now requests the store holds (key -> stored text), as last read with
        the store's entries (:mod:`~celery_leader.schedule.run_request`); none by default."""
        return {}

    def run_job(self, name: str) -> Job | str:
        """The job a run-now request of entry ``name`` sends through :meth:`send` (its
        code or stored definition and options, paused or not), or why it is refused."""
        return f"no entry {name} this scheduler can run"

    def demoted(self) -> None:  # noqa: B027
        """This scheduler stopped dispatching: give back what only a leader needs."""

    def publishing(self) -> AbstractContextManager[object]:
        """Wraps the publishes of one claimed batch (Celery pipelines its publishes to
        a Redis broker)."""
        return nullcontext()


def caused_by(error: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    """Whether ``error``, or anything in its chain of causes, is one of ``kinds``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, kinds):
            return True
        current = current.__cause__ or current.__context__
    return False


#: Errors that prove nothing reached the broker: the connection was refused or its
#: host did not resolve, so no byte was written. A timeout or a reset mid-command
#: may have delivered the message.
NOT_CONNECTED: tuple[type[BaseException], ...] = (ConnectionRefusedError, socket.gaierror)
