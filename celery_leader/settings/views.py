"""What each consumer reads, as a frozen view of settings; ``LeaderConfig`` is made of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar, cast

from .table import DEFAULT_LEDGER_RETENTION, LOOPBACK_NAMES

V = TypeVar("V")


class View(Generic[V]):
    """A config attribute that gives a frozen copy of one view's fields of the config."""

    def __init__(self, view: type[V]) -> None:
        self.make: Callable[..., V] = view
        self.names = [field.name for field in fields(cast(Any, view))]

    def __get__(self, config: object, owner: Any = None) -> V:
        if config is None:  # looked up on the class (by inspect, doc tools): no config
            raise AttributeError("a view of a config, not of its class")
        return self.make(**{name: getattr(config, name) for name in self.names})


@dataclass(frozen=True, kw_only=True)
class ElectionSettings:
    """What an elector reads: the store, the timing, the names and the clock."""

    url: str
    ttl: float
    renew_interval: float
    key_prefix: str
    instance_id: str
    replica_acks: int | None = None
    clock: str = "store"
    max_clock_skew: float = 5.0
    #: Not a setting: the broker this app's processes share (``scheme://host:port/vhost``,
    #: no credentials), stored with each term so that a follower can tell a holder
    #: of another deployment sharing the store and key prefix (``None``: unknown).
    deployment: str | None = None


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    """What a leader scheduler reads besides its election's settings."""

    beat_election: str
    tick_timeout: float | None = None
    max_publish_failures: int = 3
    missed_slots: str = "once"
    missed_slots_grace: float | None = None
    crontab_dst: str = "cron"
    entries_allow: tuple[str, ...] = ("*",)
    #: Read by the entries' editors (the CLI, the Python API, the console).
    audit_keep: int = 10_000


@dataclass(frozen=True, kw_only=True)
class LedgerSettings:
    """What the run ledger reads: whether it is on, what it keeps, how slots overlap."""

    ledger: bool = True
    on_redelivery: str = "rerun"
    ledger_retention: float = DEFAULT_LEDGER_RETENTION
    ledger_keep: int = 10_000
    ledger_resend_after: float = 3600.0
    overlap: str = "allow"
    overlap_wait: float = 60.0
    sentry_crons: bool = False


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """Where this instance reports its health and metrics (``None``: nowhere)."""

    health_file: str | None = None
    health_port: int | None = None
    metrics_port: int | None = None


@dataclass(frozen=True, kw_only=True)
class ConsoleSettings:
    """What the console reads: whether it may change anything, and for whom."""

    console_write: bool = False
    #: A secret: never in a repr (logs, tracebacks).
    console_token: str | None = field(default=None, repr=False)
    console_allowed_hosts: tuple[str, ...] = LOOPBACK_NAMES
