"""What ``leader run`` was asked to do, checked before it campaigns."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from ..exceptions import ConfigError
from ..settings.config import LeaderConfig, validate_name
from .timing import DEFAULT_GRACE, KILL_SLACK, max_grace

#: ``--restart`` values: what happens when the command exits on its own.
RESTART = ("never", "on-failure", "always")


@dataclass(frozen=True)
class RunSpec:
    """A validated ``leader run``: the election, the command and how to stop it."""

    election: str
    command: tuple[str, ...]
    grace: float  # seconds between the stop signal and SIGKILL
    restart: str  # one of RESTART


def run_spec(
    config: LeaderConfig,
    election: str,
    command: Sequence[str],
    grace: float | None = None,
    restart: str = "never",
) -> RunSpec:
    """Check the arguments of ``leader run``; a :class:`ConfigError` says what is wrong.
    ``grace`` defaults to :data:`DEFAULT_GRACE`, or what the ttl leaves (a larger: an error)."""
    validate_name("election", election)
    if not command:
        raise ConfigError("no command to run: give it after --, as in: run --election NAME -- CMD")
    if shutil.which(command[0]) is None:
        raise ConfigError(f"cannot execute {command[0]!r}: not found, or not executable")
    if restart not in RESTART:
        raise ConfigError(f"--restart must be one of {', '.join(RESTART)} (got {restart!r})")
    limit = max_grace(config.ttl, config.renew_interval)
    if limit <= 0:
        raise ConfigError(
            f"ttl {config.ttl:g} s with renew interval {config.renew_interval:g} s leaves no "
            f"time to stop the command before the lease can pass: lengthen the ttl"
        )
    if grace is None:
        grace = min(DEFAULT_GRACE, limit)
    elif not 0 <= grace <= limit:
        raise ConfigError(
            f"--grace must be between 0 and {limit:.2f} s with ttl {config.ttl:g} s and renew "
            f"interval {config.renew_interval:g} s: the command must be gone (grace + "
            f"{KILL_SLACK:g} s) before the lease can pass (got {grace:g})"
        )
    return RunSpec(election, tuple(command), grace, restart)
