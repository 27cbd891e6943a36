"""Dramatiq's side of the schedule entries kept in the store: ``python -m celery_leader
entries --app MODULE ...`` and :func:`entries_of` (the commands are
:mod:`celery_leader.cli.entries`)."""

from __future__ import annotations

from typing import Any

from ..cli.entries import CodeEntry, EntriesApp, ScheduleEntries
from ..settings.config import LeaderConfig
from .runner import load_app, settings_of
from .scheduler import entries_of as code_entries
from .scheduler import refused_options


def entries_app(broker: Any, config: LeaderConfig) -> EntriesApp:
    """What the entries commands need of a Dramatiq ``broker`` and its settings."""
    code = {
        job.name: CodeEntry(
            task=job.payload.actor_name,
            schedule=repr(job.series),
            series=job.series,
            args=getattr(job.series, "args", ()),
            kwargs=getattr(job.series, "kwargs", {}),
            options=getattr(job.series, "limits", {}),
        )
        for job in code_entries(broker, config)
    }
    return EntriesApp(config, code, set(broker.actors), refuses=refused_options(broker))


def load(broker_path: str) -> EntriesApp:
    """The entries app of the Dramatiq broker in ``broker_path`` (``module[:broker]``)."""
    broker, config = load_app(broker_path, ())
    return entries_app(broker, config)


def entries_of(broker: Any, config: LeaderConfig | None = None) -> ScheduleEntries:
    """The Python API of the entries kept in the store, for Dramatiq ``broker``
    (``config`` default: the settings of the broker's ``LeaderMiddleware``)."""
    return ScheduleEntries(
        entries_app(broker, config or settings_of(broker) or LeaderConfig.from_env())
    )
