"""Settings -> a validated :class:`LeaderConfig`.

Every ``leader_*`` setting is read from ``app.conf``; with Django's
``config_from_object('django.conf:settings', namespace='CELERY')`` they are
spelled ``CELERY_LEADER_URL``, ``CELERY_LEADER_TTL`` and so on. A bad value fails
at startup with one line that names the setting as the user spelled it.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ._urls import mask_url, scheme_of
from .backends.registry import STORES, Store, store_for, store_hints
from .contrib.django_db import django_database
from .exceptions import ConfigError
from .process import default_instance_id

logger = logging.getLogger(__name__)
#: Schemes ``leader_url`` accepts, and the kind of store each one selects
#: (read from the one table of stores, :data:`celery_leader.backends.STORES`).
SCHEMES: dict[str, str] = {scheme: store.kind for store in STORES for scheme in store.schemes}

#: Broker schemes that name a Redis server we can reuse as the lease store.
_REDIS_BROKER_SCHEMES = ("redis", "rediss")

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]+$")

#: Largest clock *rate* difference assumed between this host and the store
#: (1 %, far above NTP-disciplined clocks' ~0.01 %). Safety holds while real
#: drift stays below it; beat's fenced claims keep slots unique even beyond.
DRIFT = 0.01
#: Covers the store's one-millisecond expiry granularity and rounding.
MARGIN = 0.005

DEFAULT_TTL = 15.0
DEFAULT_KEY_PREFIX = "celery_leader"

#: The shortest deadline a store call gets (``backends.store_timeout`` never
#: goes below it): under it a healthy store on a busy host misses deadlines.
STORE_TIMEOUT_FLOOR = 0.05
#: The longest ttl every store can represent: PostgreSQL's
#: ``idle_session_timeout`` (the ttl there) is a 32-bit count of milliseconds.
MAX_TTL = 2_147_483.0

#: ``leader_missed_slots`` values: what a leader sends for the slots of an
#: entry that fell due while nobody dispatched (see docs/operations.md).
MISSED_SLOTS = ("once", "skip", "all")
DEFAULT_MAX_PUBLISH_FAILURES = 3
#: ``leader_crontab_dst`` values: how Celery crontab entries behave when the
#: clock changes (see docs/beat.md, "Daylight-saving time").
CRONTAB_DST = ("cron", "celery")
#: ``leader_replica_acks`` value that lets the store's topology decide.
AUTO = "auto"
#: ``leader_clock`` values: the clock schedules run on. ``"store"``: the store's
#: (Redis ``TIME``, PostgreSQL ``clock_timestamp()``, etcd's HTTP ``Date``), as
#: measured by each lease, so replicas' own clocks stop mattering; stores without
#: a clock (file, memory) use the local one. ``"local"``: each replica's own.
CLOCKS = ("store", "local")
#: ``leader_max_clock_skew``: how far (seconds) a host's clock may be from the
#: store's before it is logged (and, with ``leader_clock = "local"``, before the
#: host stops leading). NTP keeps hosts within milliseconds, so 5 s means a
#: broken clock, not jitter; it is also well above what the measurement can
#: blur (etcd's ``Date`` has 1 s resolution: 0.5 s error, plus half a round trip),
#: so no healthy host warns; and it is under one period of the common every-10 s
#: entries, so with local clocks a skewed replica stops leading before it sends
#: a slot a whole period early.
DEFAULT_MAX_CLOCK_SKEW = 5.0
#: ``leader_on_redelivery`` values: a slot whose worker died mid-run (its
#: liveness in the run ledger expired) is run again, or recorded skipped.
ON_REDELIVERY = ("rerun", "skip")
#: ``leader_ledger_retention``: two days, so yesterday's slots stay visible
#: and deduplicated through a whole day's redeliveries and restarts.
DEFAULT_LEDGER_RETENTION = 2 * 86400.0
#: ``leader_ledger_keep``: the runs kept per entry. A record is also what drops a
#: redelivered copy of its slot, so an entry must keep its runs for as long as a
#: broker may redeliver: 10,000 covers Celery's one-hour Redis visibility timeout
#: for an entry every 0.36 s, and keeps an entry every second from holding more
#: than about 3 MB of the store (10,000 records of ~250 B) whatever the retention.
DEFAULT_LEDGER_KEEP = 10_000
#: ``leader_overlap`` values: what a slot does while the previous slot of its
#: entry still runs: run anyway, be skipped, or wait (up to ``leader_overlap_wait``).
OVERLAP = ("allow", "skip", "wait")
#: ``leader_overlap_wait``: a minute, long enough for a run that overstays its
#: period a little, short enough that a worker slot is not held for long.
DEFAULT_OVERLAP_WAIT = 60.0


@dataclass(frozen=True)
class LeaderConfig:
    """The validated ``leader_*`` settings of one Celery app."""

    url: str
    ttl: float
    renew_interval: float
    key_prefix: str
    beat_election: str
    worker_election: str
    instance_id: str
    fence_tasks: bool
    #: Beat's tick watchdog: a scheduler that has not finished a tick for this
    #: long stops renewing and hands over (``None``: the ttl).
    tick_timeout: float | None = None
    #: Consecutive failed publishes after which a beat leader resigns.
    max_publish_failures: int = DEFAULT_MAX_PUBLISH_FAILURES
    #: File rewritten with this instance's health (``None``: none).
    health_file: str | None = None
    #: Port of the Prometheus endpoint (``None``: no endpoint).
    metrics_port: int | None = None
    #: Port of the HTTP health endpoint, ``/healthz`` and ``/leader`` (``None``: none).
    health_port: int | None = None
    missed_slots: str = "once"
    #: A missed slot due longer ago than this is never sent (``None``: no limit).
    missed_slots_grace: float | None = None
    #: Celery crontabs at clock changes: cron's rules, or Celery's own arithmetic.
    crontab_dst: str = "cron"
    #: The broker this app's processes share (``scheme://host:port/vhost``, no
    #: credentials), stored with each term so that a follower can tell a holder
    #: of another deployment sharing the store and key prefix (``None``: unknown).
    deployment: str | None = None
    #: Replicas of the store that must hold a claim or a new term before it
    #: counts (``None``: ``"auto"``, decided by the store's topology).
    replica_acks: int | None = None
    #: The clock schedules run on: ``"store"`` or ``"local"`` (see :data:`CLOCKS`).
    clock: str = "store"
    #: Seconds a host's clock may be off the store's before it is logged, and with
    #: ``clock = "local"`` before the host stops leading.
    max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW
    #: Run ledger: workers record each beat-sent slot and run it once. On by
    #: default: beat re-sends only while workers with the dedup step register,
    #: so a fleet without it keeps today's at-most-once behaviour.
    ledger: bool = True
    #: A slot whose worker died mid-run: run it again or not (see :data:`ON_REDELIVERY`).
    on_redelivery: str = "rerun"
    #: Seconds a run record is kept after its last write.
    ledger_retention: float = DEFAULT_LEDGER_RETENTION
    #: Runs kept per entry (the most recently written), beside the retention.
    ledger_keep: int = DEFAULT_LEDGER_KEEP
    #: Entries' default ``overlap`` (see :data:`OVERLAP`).
    overlap: str = "allow"
    #: Longest wait of a slot of an ``overlap = "wait"`` entry, seconds.
    overlap_wait: float = DEFAULT_OVERLAP_WAIT
    #: Sentry Crons check-ins from the run ledger's worker step (needs sentry-sdk).
    sentry_crons: bool = False
    #: Task-name globs a schedule entry kept in the store may name; the leader
    #: skips (and logs) any other. ``("*",)``: every task.
    entries_allow: tuple[str, ...] = ("*",)

    @property
    def display_url(self) -> str:
        """``url`` with its password masked, for logs, banners and CLI output."""
        return mask_url(self.url)

    @property
    def store(self) -> Store:
        """The store ``url`` selects (validated, so always known); for
        ``django://ALIAS``, the one the alias's ``ENGINE`` selects."""
        scheme = scheme_of(self.url)
        store = store_for(django_database(self.url).scheme if scheme == "django" else scheme)
        if store is None:  # only a LeaderConfig built by hand, not by from_mapping
            raise ConfigError(f"leader_url {mask_url(self.url)!r} names no known store")
        return store

    @property
    def connection(self) -> dict[str, Any] | None:
        """The store client's connection parameters when Django's ``DATABASES``
        give them (``django://ALIAS``); ``None``: the store reads ``url``."""
        if scheme_of(self.url) != "django":
            return None
        return django_database(self.url).connection

    @property
    def watchdog_timeout(self) -> float:
        """``tick_timeout``, or the ttl when it is not set."""
        return self.ttl if self.tick_timeout is None else self.tick_timeout

    @property
    def store_kind(self) -> str:
        """``"redis"``, ``"postgres"``, ``"etcd"``, ``"file"`` or ``"memory"``."""
        return self.store.kind

    @classmethod
    def from_app(cls, app: Any) -> LeaderConfig:
        """Read and validate the settings of ``app`` (a :class:`celery.Celery`)."""
        conf = app.conf
        prefix = namespace_of(app)
        names = {key: spelled(key, prefix) for key in SETTINGS}
        warn_unknown((str(key) for key in conf.keys()), prefix)
        return cls.from_mapping(
            {k: conf.get(k) for k in SETTINGS}, broker_url=conf.get("broker_url"), names=names
        )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        names: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> LeaderConfig:
        """Read ``CELERY_LEADER_*`` environment variables, for processes without Celery.

        ``overrides`` (``leader_ttl=...``, keyed like the settings) win over the
        environment; ``None`` means "not given". Errors name the variable, or for an
        override its name in ``names`` (``"ttl="`` for a middleware argument).
        """
        environ = os.environ if environ is None else environ
        warn_unknown(environ, "CELERY_")
        values: dict[str, Any] = {key: environ.get(env_name(key)) for key in SETTINGS}
        shown = {key: env_name(key) for key in SETTINGS}
        for key, value in overrides.items():
            if value is not None:
                values[key] = value
                shown[key] = (names or {}).get(key, key)
        if values.get("leader_url") in (None, ""):
            raise ConfigError(f"{shown['leader_url']} is not set: set it to {store_hints()}")
        return cls.from_mapping(values, names=shown)

    @classmethod
    def from_mapping(
        cls,
        values: dict[str, Any],
        broker_url: str | None = None,
        names: Mapping[str, str] | None = None,
    ) -> LeaderConfig:
        """Validate raw setting values (``None`` means "not set").

        An error names the setting as ``names`` spells it (an environment
        variable, a middleware argument), else by its ``app.conf`` key.
        """
        spelled = names or {}

        def n(key: str) -> str:
            return spelled.get(key, key)

        url = _url(values.get("leader_url"), broker_url, n("leader_url"))
        ttl = _positive(n("leader_ttl"), values.get("leader_ttl"), DEFAULT_TTL)
        # Renewing three times per ttl leaves two more attempts after a failed
        # one before the lease runs out (every 5 s for the default 15 s ttl).
        renew = _positive(n("leader_renew_interval"), values.get("leader_renew_interval"), ttl / 3)
        check_timing(ttl, renew, n("leader_ttl"), n("leader_renew_interval"))
        check_ttl(ttl, renew, n("leader_ttl"), n("leader_renew_interval"))
        tick_timeout = values.get("leader_tick_timeout")
        if tick_timeout is not None:
            tick_timeout = _positive(n("leader_tick_timeout"), tick_timeout, ttl)
        if tick_timeout is not None and tick_timeout > MAX_TTL:
            raise ConfigError(
                f"{n('leader_tick_timeout')} must be at most {MAX_TTL:,.0f} s "
                f"(got {tick_timeout:g})"
            )
        grace = values.get("leader_missed_slots_grace")
        return cls(
            url=url,
            ttl=ttl,
            renew_interval=renew,
            key_prefix=_name(
                n("leader_key_prefix"), values.get("leader_key_prefix"), DEFAULT_KEY_PREFIX
            ),
            beat_election=_name(
                n("leader_beat_election"), values.get("leader_beat_election"), "beat"
            ),
            worker_election=_name(
                n("leader_worker_election"), values.get("leader_worker_election"), "worker"
            ),
            instance_id=_instance_id(values.get("leader_instance_id"), n("leader_instance_id")),
            fence_tasks=_bool(n("leader_fence_tasks"), values.get("leader_fence_tasks"), False),
            tick_timeout=tick_timeout,
            max_publish_failures=_count(
                n("leader_max_publish_failures"),
                values.get("leader_max_publish_failures"),
                DEFAULT_MAX_PUBLISH_FAILURES,
            ),
            health_file=_path(n("leader_health_file"), values.get("leader_health_file")),
            metrics_port=_port(n("leader_metrics_port"), values.get("leader_metrics_port")),
            health_port=_port(n("leader_health_port"), values.get("leader_health_port")),
            missed_slots=validate_missed_slots(
                n("leader_missed_slots"), values.get("leader_missed_slots", "once") or "once"
            ),
            deployment=deployment_of(broker_url),
            missed_slots_grace=validate_grace(
                n("leader_missed_slots_grace"), None if grace == "" else grace
            ),
            crontab_dst=_choice(
                n("leader_crontab_dst"), values.get("leader_crontab_dst") or "cron", CRONTAB_DST
            ),
            replica_acks=_replica_acks(n("leader_replica_acks"), values.get("leader_replica_acks")),
            clock=_choice(n("leader_clock"), values.get("leader_clock") or "store", CLOCKS),
            max_clock_skew=_positive(
                n("leader_max_clock_skew"),
                values.get("leader_max_clock_skew"),
                DEFAULT_MAX_CLOCK_SKEW,
            ),
            ledger=_bool(n("leader_ledger"), values.get("leader_ledger"), True),
            on_redelivery=_choice(
                n("leader_on_redelivery"),
                values.get("leader_on_redelivery") or "rerun",
                ON_REDELIVERY,
            ),
            ledger_retention=_retention(
                n("leader_ledger_retention"), values.get("leader_ledger_retention"), ttl
            ),
            ledger_keep=_count(
                n("leader_ledger_keep"), values.get("leader_ledger_keep"), DEFAULT_LEDGER_KEEP
            ),
            overlap=_choice(n("leader_overlap"), values.get("leader_overlap") or "allow", OVERLAP),
            overlap_wait=_positive(
                n("leader_overlap_wait"), values.get("leader_overlap_wait"), DEFAULT_OVERLAP_WAIT
            ),
            sentry_crons=_bool(n("leader_sentry_crons"), values.get("leader_sentry_crons"), False),
            entries_allow=_globs(n("leader_entries_allow"), values.get("leader_entries_allow")),
        )


#: Every ``leader_*`` setting, as spelled in ``app.conf``.
SETTINGS = (
    "leader_url",
    "leader_ttl",
    "leader_renew_interval",
    "leader_key_prefix",
    "leader_beat_election",
    "leader_worker_election",
    "leader_instance_id",
    "leader_fence_tasks",
    "leader_tick_timeout",
    "leader_max_publish_failures",
    "leader_health_file",
    "leader_metrics_port",
    "leader_health_port",
    "leader_missed_slots",
    "leader_missed_slots_grace",
    "leader_crontab_dst",
    "leader_replica_acks",
    "leader_clock",
    "leader_max_clock_skew",
    "leader_ledger",
    "leader_on_redelivery",
    "leader_ledger_retention",
    "leader_ledger_keep",
    "leader_overlap",
    "leader_overlap_wait",
    "leader_sentry_crons",
    "leader_entries_allow",
)


def namespace_of(app: Any) -> str:
    """What ``app``'s settings start with: ``"CELERY_"`` under Django's namespace, else ``""``."""
    namespace = getattr(app, "namespace", None)
    return f"{namespace}_" if namespace else ""


def spelled(setting: str, prefix: str) -> str:
    """``setting`` as spelled in ``app.conf``: ``leader_ttl``, or ``CELERY_LEADER_TTL`` (Django)."""
    return f"{prefix}{setting}".upper() if prefix else setting


#: ``CELERY_LEADER_*`` names that are not settings: the worker names its
#: deadline table to spawned pool processes in ``CELERY_LEADER_TABLE``, and
#: its shared counter file in ``CELERY_LEADER_COUNTERS``; a process started by
#: a worker inherits both and must not warn about them.
NOT_SETTINGS = ("leader_table", "leader_counters")

#: Keys already warned about: beat reads its settings twice, a worker once per step.
_warned: set[str] = set()


def warn_unknown(keys: Iterable[str], prefix: str) -> None:
    """One WARNING per ``leader_*`` key (after ``prefix``) that is no setting, with a suggestion.

    A misspelt setting is otherwise silently ignored and its default used.
    """
    for key in keys:
        if not key.upper().startswith(f"{prefix}LEADER_".upper()):
            continue
        name = key[len(prefix) :].lower()
        if name in SETTINGS or name in NOT_SETTINGS or key in _warned:
            continue
        _warned.add(key)
        # Compared without the "leader_" every name shares, which would make
        # any key look close to some setting.
        close = difflib.get_close_matches(name[7:], [s[7:] for s in SETTINGS], n=1)
        hint = f"; did you mean {spelled('leader_' + close[0], prefix)}?" if close else ""
        logger.warning("celery-leader: unknown setting %s is ignored%s", key, hint)


def env_name(setting: str) -> str:
    """The environment variable (and Django setting) of ``setting``: ``CELERY_LEADER_TTL``."""
    return f"CELERY_{setting.upper()}"


def validity(ttl: float) -> float:
    """How long a term is trusted after its acquire or renew request was sent."""
    return ttl * (1 - DRIFT) - MARGIN


def check_timing(ttl: float, renew: float, ttl_name: str, renew_name: str) -> None:
    """A leader must renew before its belief (shorter than the ttl) runs out."""
    if not 0 < renew < validity(ttl):
        raise ConfigError(
            f"{renew_name} must be greater than 0 and smaller than {ttl_name} less "
            f"{DRIFT:.0%} and {MARGIN * 1000:g} ms, so that the leader renews before its "
            f"lease runs out (got renew interval {renew:g} s, ttl {ttl:g} s)"
        )


def check_ttl(ttl: float, renew: float, ttl_name: str, renew_name: str) -> None:
    """Bounds of the ttl that the lease's timing arithmetic needs, one line each.

    Low end: a renewal gets ``store_timeout = min(renew, ttl - renew)`` to answer,
    never less than :data:`STORE_TIMEOUT_FLOOR`. Below the floor the deadline is
    raised to it, a renewal can then outlast the leader's belief, and the lease
    flaps (ttl 0.01: 29 hand-overs in 9 s). High end: :data:`MAX_TTL`.
    """
    if min(renew, ttl - renew) < STORE_TIMEOUT_FLOOR - 1e-9:  # ttl / 3 rounds down
        raise ConfigError(
            f"{ttl_name} is too short: {renew_name} ({renew:g} s) and {ttl_name} less "
            f"{renew_name} ({ttl - renew:g} s) must each be at least the store call "
            f"deadline floor of {STORE_TIMEOUT_FLOOR * 1000:g} ms, so a renewal can answer "
            f"before the lease runs out (ttl {ttl:g} s; at least {3 * STORE_TIMEOUT_FLOOR:g} s "
            "with the default renew interval)"
        )
    if ttl > MAX_TTL:
        raise ConfigError(
            f"{ttl_name} must be at most {MAX_TTL:,.0f} s (about 24.8 days, the longest ttl "
            f"every store can represent; got {ttl:g})"
        )


def validate_missed_slots(setting: str, value: object) -> str:
    """Check a missed-slot policy: ``"once"``, ``"skip"`` or ``"all"``."""
    return _choice(setting, value, MISSED_SLOTS)


def _choice(setting: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{setting} must be one of {', '.join(choices)} (got {value!r})")
    return str(value)


def validate_grace(setting: str, value: object) -> float | None:
    """Check a missed-slot grace window: seconds greater than 0, or ``None``."""
    return None if value is None else _positive(setting, value, 0.0)


def validate_name(setting: str, value: object) -> str:
    """Check an election name or key prefix: non-empty, no spaces or braces.

    Braces are refused because Redis Cluster hash tags (``{prefix:election}``)
    are built from these names.
    """
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(
            f"{setting} must be a non-empty string of letters, digits and _ . : - (got {value!r})"
        )
    return value


def _globs(setting: str, value: object) -> tuple[str, ...]:
    """Task-name globs: a list of strings, or one comma-separated string (``None``: all)."""
    if value is None or value == "":
        return ("*",)
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{setting} must be a list of task-name globs (got {value!r})")
    globs = tuple(i.strip() for i in items if i.strip())
    if not globs:
        raise ConfigError(f"{setting} names no glob (got {value!r}): no entry could ever run")
    return globs


def _url(value: object, broker_url: object, setting: str) -> str:
    if value in (None, ""):
        if isinstance(broker_url, str) and scheme_of(broker_url) in _REDIS_BROKER_SCHEMES:
            return broker_url
        shown = mask_url(broker_url) if isinstance(broker_url, str) else broker_url
        raise ConfigError(
            f"{setting} is not set and broker_url ({shown!r}) is not a Redis URL: set "
            f"{setting} to {store_hints()}"
        )
    if not isinstance(value, str):
        raise ConfigError(f"{setting} must be a string URL (got {type(value).__name__})")
    scheme = scheme_of(value)
    if store_for(scheme) is None:
        raise ConfigError(
            f"{setting} has unknown scheme {scheme!r} in {mask_url(value)!r}; "
            f"use one of {', '.join(s + '://' for s in SCHEMES)}"
        )
    if scheme == "file" and not value.startswith("file:///"):
        raise ConfigError(
            f"{setting} {value!r} must name an absolute directory, like file:///var/lib/leader"
        )
    return value


def _positive(setting: str, value: object, default: float) -> float:
    if value is None:
        return default
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{setting} must be a number of seconds (got {value!r})") from None
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"{setting} must be a number of seconds greater than 0 (got {value!r})")
    return number


def _whole(value: object) -> int:
    """``value`` as an int if it is a whole number (or its string), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError
    number = float(value)
    if not number.is_integer():
        raise ValueError
    return int(number)


def _count(setting: str, value: object, default: int) -> int:
    if value is None:
        return default
    try:
        number = _whole(value)
    except (ValueError, OverflowError):
        raise ConfigError(f"{setting} must be a whole number (got {value!r})") from None
    if number < 1:
        raise ConfigError(f"{setting} must be at least 1 (got {value!r})")
    return number


def _replica_acks(setting: str, value: object) -> int | None:
    """``"auto"`` (``None``) or how many replicas must acknowledge: a whole number >= 0."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", AUTO)):
        return None
    try:
        number = _whole(value)
    except (ValueError, OverflowError):
        number = -1
    if number < 0:
        raise ConfigError(
            f"{setting} must be {AUTO!r} or a whole number of replicas, 0 or more (got {value!r})"
        )
    return number


def _path(setting: str, value: object) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{setting} must be a file path (got {value!r})")
    return value


def _port(setting: str, value: object) -> int | None:
    if value in (None, ""):
        return None
    try:
        port = _whole(value)
    except (ValueError, OverflowError):
        raise ConfigError(f"{setting} must be a TCP port number (got {value!r})") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{setting} must be a TCP port from 1 to 65535 (got {value!r})")
    return port


def _name(setting: str, value: object, default: str) -> str:
    return default if value is None else validate_name(setting, value)


def _instance_id(value: object, setting: str) -> str:
    if value is None:
        return default_instance_id()
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{setting} must be a non-empty string (got {value!r})")
    return value


def _retention(setting: str, value: object, ttl: float) -> float:
    retention = _positive(setting, value, DEFAULT_LEDGER_RETENTION)
    # A record must outlive the liveness it carries (one ttl) many times over,
    # or a second delivery could find no record and run the slot again.
    if retention < 60 * ttl:
        raise ConfigError(
            f"{setting} must be at least 60 x leader_ttl ({60 * ttl:g} s), got {retention:g}"
        )
    return retention


def _bool(setting: str, value: object, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in (
        "1",
        "true",
        "yes",
        "on",
        "0",
        "false",
        "no",
        "off",
    ):
        return value.lower() in ("1", "true", "yes", "on")
    raise ConfigError(f"{setting} must be true or false (got {value!r})")


def deployment_of(broker_url: object) -> str | None:
    """``scheme://host:port/vhost`` of a broker URL (the first of a failover list).

    Credentials and query are left out: the tag is stored in the lease store
    and shown in logs.
    """
    if isinstance(broker_url, (list, tuple)):
        broker_url = broker_url[0] if broker_url else None
    if not isinstance(broker_url, str) or "://" not in broker_url:
        return None
    parts = urlsplit(broker_url.split(";")[0].strip())
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path or '/'}"
