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
    """The lease store could not be reached or did not answer in time.

    The lease treats this as "nobody can prove they lead": a leader keeps
    believing only until its validity deadline runs out.
    """


class StoreMisconfigured(StoreUnavailable, ConfigError):
    """The store answers, but cannot serve ``leader_url`` as configured.

    Only the store can tell: a PostgreSQL older than 14, a pooler in
    transaction mode, ``?cluster=true`` on a Redis without cluster support.
    It is a :class:`StoreUnavailable`, so the lease retries it like an outage
    (nobody leads meanwhile, and a fix on the store side needs no restart),
    and a :class:`ConfigError`, whose one line names ``leader_url`` and what
    to change.
    """


class NotLeader(LeaderError):
    """Raised by ``ensure_leader()``: this process does not lead the election (any more).

    A long task body that calls it between steps stops before a side effect
    that another leader may be making at the same time.
    """


class TermEnded(LeaderError):
    """This instance's term ended while it used it: a claim batch failed as a whole.

    Not store trouble: another instance leads now (or is about to), and this one
    stops dispatching until the lease says otherwise.
    """
