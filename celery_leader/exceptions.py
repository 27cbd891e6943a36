"""Exceptions raised by celery-leader."""

from __future__ import annotations


class LeaderError(Exception):
    """Base class of every celery-leader error."""


class ConfigError(LeaderError, ValueError):
    """A ``leader_*`` setting is invalid; the message names the setting."""


class MissingExtra(LeaderError, ImportError):
    """An optional dependency is not installed; the message names the extra."""


def missing_extra(exc: ModuleNotFoundError, extra: str) -> MissingExtra:
    """The one-line error for a missing optional dependency (raise it ``from None``)."""
    return MissingExtra(
        f"celery-leader needs {exc.name!r} for this, and it is not installed: "
        f"pip install 'celery-leader[{extra}]'"
    )


class StoreUnavailable(LeaderError):
    """The lease store could not be reached or did not answer in time: a leader keeps
    believing only until its validity deadline runs out."""


class StoreMisconfigured(StoreUnavailable, ConfigError):
    """The store answers, but cannot serve ``leader_url`` as configured (a PostgreSQL older
    than 14, a pooler in transaction mode, ...): retried like an outage, as a fix on the
    store side needs no restart, and a :class:`ConfigError` naming what to change."""


class NotLeader(LeaderError):
    """Raised by ``ensure_leader()``: this process does not lead the election (any more)."""


class TermEnded(LeaderError):
    """This instance's term ended while it used it: a claim batch failed as a whole
    (not store trouble: another instance leads now, or is about to)."""
