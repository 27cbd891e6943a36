"""The one table of ``leader_*`` settings, each spelt, read and described once.

A :class:`Setting` row names the setting (``leader_ttl``; ``CELERY_LEADER_TTL`` in
Django settings and the environment), the reader that checks a value, its default
(or how it is derived) and one line on what it means.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..backends.registry import STORES, store_for, store_hints
from ..backends.urls import mask_url, scheme_of
from ..exceptions import ConfigError
from .process import default_instance_id

logger = logging.getLogger(__name__)

DEFAULT_TTL = 15.0
DEFAULT_KEY_PREFIX = "celery_leader"
#: Two days, so yesterday's slots stay visible and deduplicated through a whole
#: day's redeliveries and restarts.
DEFAULT_LEDGER_RETENTION = 2 * 86400.0
#: ``leader_missed_slots`` values: what a leader sends for the slots of an
#: entry that fell due while nobody dispatched (see docs/operations.md).
MISSED_SLOTS = ("once", "skip", "all")
#: ``leader_overlap`` values: what a slot does while the previous slot of its
#: entry still runs: run anyway, be skipped, or wait (up to ``leader_overlap_wait``).
OVERLAP = ("allow", "skip", "wait")

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]+$")
#: Schemes of kombu's Redis transport: a ``broker_url`` of one is also a lease store.
_REDIS_BROKER_SCHEMES = ("redis", "rediss")
#: The names of this host's loopback interface: what the console answers to by default.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: ``(setting as the user spelt it, value or None, default) -> value``, or a ConfigError.
Reader = Callable[[str, Any, Any], Any]


@dataclass(frozen=True)
class Setting:
    """One setting, ``leader_<field>``, read into the ``LeaderConfig`` field ``field``."""

    field: str
    read: Reader
    #: The default, or a function of the settings read before it (by field name).
    default: Any
    doc: str
    #: The default as the docs write it, where that is not the value itself.
    shown: str = ""

    @property
    def name(self) -> str:
        """The setting in ``app.conf``: ``leader_ttl``."""
        return f"leader_{self.field}"


def _seconds(setting: str, value: object, default: float | None) -> float | None:
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


def _seconds_or_never(setting: str, value: object, default: float) -> float:
    """Seconds, 0 for never."""
    if _whole(value) == 0:
        return 0.0
    try:
        number = _seconds(setting, value, default)
    except (ConfigError, OverflowError):
        why = f"{setting} must be a number of seconds, or 0 for never (got {value!r})"
        raise ConfigError(why) from None
    assert number is not None
    return number


def _grace(setting: str, value: object, default: None) -> float | None:
    return validate_grace(setting, None if value == "" else value)


def validate_grace(setting: str, value: object) -> float | None:
    """Check a missed-slot grace window: seconds greater than 0, or ``None``."""
    return _seconds(setting, value, None)


def _whole(value: object) -> int | None:
    """``value`` as an int if it is a whole number (or its string), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return int(number) if number.is_integer() else None


def _count(setting: str, value: object, default: int) -> int:
    if value is None:
        return default
    number = _whole(value)
    if number is None:
        raise ConfigError(f"{setting} must be a whole number (got {value!r})")
    if number < 1:
        raise ConfigError(f"{setting} must be at least 1 (got {value!r})")
    return number


def _port(setting: str, value: object, default: None) -> int | None:
    if value in (None, ""):
        return default
    port = _whole(value)
    if port is None:
        raise ConfigError(f"{setting} must be a TCP port number (got {value!r})")
    if not 0 < port < 65536:
        raise ConfigError(f"{setting} must be a TCP port from 1 to 65535 (got {value!r})")
    return port


def _replicas(setting: str, value: object, default: None) -> int | None:
    """``"auto"`` (``None``: the store's topology decides) or a whole number >= 0."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return default
    number = _whole(value)
    if number is None or number < 0:
        raise ConfigError(
            f"{setting} must be 'auto' or a whole number of replicas, 0 or more (got {value!r})"
        )
    return number


def _path(setting: str, value: object, default: None) -> str | None:
    if value in (None, ""):
        return default
    if not isinstance(value, str):
        raise ConfigError(f"{setting} must be a file path (got {value!r})")
    return value


def _flag(setting: str, value: object, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    raise ConfigError(f"{setting} must be true or false (got {value!r})")


def _instance_id(setting: str, value: object, default: None) -> str:
    if value is None:
        return default_instance_id()
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{setting} must be a non-empty string (got {value!r})")
    return value


def _name(setting: str, value: object, default: str) -> str:
    return default if value is None else validate_name(setting, value)


def validate_name(setting: str, value: object) -> str:
    """Check an election name or key prefix: non-empty, no spaces or braces (Redis Cluster
    hash tags, ``{prefix:election}``, are built from these names)."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(
            f"{setting} must be a non-empty string of letters, digits and _ . : - (got {value!r})"
        )
    return value


def _one_of(*choices: str) -> Reader:
    return lambda setting, value, default: _choice(setting, value or default, choices)


def _choice(setting: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{setting} must be one of {', '.join(choices)} (got {value!r})")
    return str(value)


def validate_missed_slots(setting: str, value: object) -> str:
    """Check a missed-slot policy: ``"once"``, ``"skip"`` or ``"all"``."""
    return _choice(setting, value, MISSED_SLOTS)


def _globs(setting: str, value: object, default: tuple[str, ...]) -> tuple[str, ...]:
    """Task-name globs: a list of strings, or one comma-separated string."""
    if value in (None, ""):
        return default
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{setting} must be a list of task-name globs (got {value!r})")
    globs = tuple(i.strip() for i in items if i.strip())
    if not globs:
        raise ConfigError(f"{setting} names no glob (got {value!r}): no entry could ever run")
    return globs


def _secret(setting: str, value: object, default: None) -> str | None:
    """A secret such as a token: a non-empty string, or not set."""
    if value in (None, ""):
        return default
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{setting} must be a non-empty string (got a {type(value).__name__})")
    return value


def _hosts(setting: str, value: object, default: tuple[str, ...]) -> tuple[str, ...]:
    """Host names: a list of strings, or one comma-separated string; lower case."""
    if value in (None, ""):
        return default
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{setting} must be a list of host names (got {value!r})")
    hosts = tuple(i.strip().lower() for i in items if i.strip())
    if not hosts:
        raise ConfigError(f"{setting} names no host (got {value!r}): no request could be served")
    return hosts


def _url(setting: str, value: object, broker_url: object) -> str:
    """A URL of a known store; when not set, ``broker_url`` if it is a Redis URL."""
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
        schemes = ", ".join(f"{s}://" for store in STORES for s in store.schemes)
        raise ConfigError(
            f"{setting} has unknown scheme {scheme!r} in {mask_url(value)!r}; use one of {schemes}"
        )
    if scheme == "file" and not value.startswith("file:///"):
        raise ConfigError(
            f"{setting} {value!r} must name an absolute directory, like file:///var/lib/leader"
        )
    return value


def deployment_of(broker_url: object) -> str | None:
    """``scheme://host:port/vhost`` of a broker URL (the first of a failover list), without
    the credentials and query: the tag is stored in the lease store and shown in logs."""
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


#: Every setting, in the order they are read: a row's default and bounds may
#: depend on the rows before it.
TABLE = (
    Setting("url", _url, lambda s: s["broker_url"], "the lease store", "broker_url"),
    Setting("ttl", _seconds, DEFAULT_TTL, "lease time-to-live, seconds"),
    # Renewing three times per ttl leaves two more attempts after a failed one
    # before the lease runs out (every 5 s for the default 15 s ttl).
    Setting("renew_interval", _seconds, lambda s: s["ttl"] / 3, "renewal period", "leader_ttl / 3"),
    Setting("tick_timeout", _seconds, None, "beat's tick watchdog", "leader_ttl"),
    Setting("key_prefix", _name, DEFAULT_KEY_PREFIX, "namespace of every key, row and file"),
    Setting("beat_election", _name, "beat", "the election LeaderScheduler joins"),
    Setting("worker_election", _name, "worker", "the default election of @leader_only"),
    Setting("instance_id", _instance_id, None, "its name in status and logs", '"<hostname>:<pid>"'),
    Setting("fence_tasks", _flag, False, "workers drop tasks sent under an older epoch"),
    Setting("max_publish_failures", _count, 3, "failed publishes in a row: beat resigns"),
    Setting("health_file", _path, None, "file rewritten with this instance's health"),
    Setting("metrics_port", _port, None, "port of the Prometheus endpoint"),
    Setting("health_port", _port, None, "port of /healthz and /leader"),
    Setting("missed_slots", _one_of(*MISSED_SLOTS), "once", "what to send of missed slots"),
    Setting("missed_slots_grace", _grace, None, "missed slots older than this are not sent"),
    Setting("crontab_dst", _one_of("cron", "celery"), "cron", "crontabs at clock changes"),
    Setting("replica_acks", _replicas, None, "replicas that must hold a claim or a term", '"auto"'),
    # "store": the store's clock as each lease measures it, so replicas' own
    # clocks stop mattering (stores without one use the local clock).
    Setting("clock", _one_of("store", "local"), "store", "the clock schedules run on"),
    # NTP keeps hosts within milliseconds, so 5 s means a broken clock, not
    # jitter; it is well above what the measurement blurs (etcd's Date has 1 s
    # resolution), and under one period of the common every-10 s entries, so with
    # local clocks a skewed replica stops leading before it sends a slot a period early.
    Setting("max_clock_skew", _seconds, 5.0, "seconds this host's clock may be off the store's"),
    # On by default: beat re-sends only while workers with the dedup step
    # register, so a fleet without it keeps at-most-once delivery.
    Setting("ledger", _flag, True, "the run ledger: each slot sent at least once, run once"),
    Setting("on_redelivery", _one_of("rerun", "skip"), "rerun", "a slot whose worker died mid-run"),
    Setting("ledger_retention", _seconds, DEFAULT_LEDGER_RETENTION, "seconds a run record is kept"),
    # A record is also what drops a redelivered copy of its slot, so an entry
    # must keep its runs as long as a broker may redeliver: 10,000 covers Celery's
    # one-hour Redis visibility timeout for an entry every 0.36 s, and keeps an
    # entry every second under about 3 MB of the store whatever the retention.
    Setting("ledger_keep", _count, 10_000, "run records kept per entry"),
    # An hour: kombu's Redis transport gives a dead worker's unacknowledged
    # message back after its visibility timeout, an hour by default, so a slot
    # held that way is not sent again before the broker would; a queue an hour
    # behind is broken anyway, and its second copies are dropped by the workers.
    # Slots an entry's later slot overtook are judged sooner (schedule/start_watch.py).
    Setting(
        "ledger_resend_after",
        _seconds_or_never,
        3600.0,
        "seconds after its publish a slot no worker started is sent again (0: never)",
    ),
    Setting("overlap", _one_of(*OVERLAP), "allow", "a slot while its entry's last one runs"),
    # A minute: long enough for a run that overstays its period a little, short
    # enough that a worker slot is not held for long.
    Setting("overlap_wait", _seconds, 60.0, "longest wait of a slot of an overlap = wait entry"),
    Setting("sentry_crons", _flag, False, "Sentry Crons check-ins from workers"),
    Setting("entries_allow", _globs, ("*",), "task globs a stored entry may name"),
    # The console pauses and triggers tasks: it changes nothing unless told to,
    # and only for a request that carries leader_console_token.
    Setting("console_write", _flag, False, "the console's actions (pause, resume, run now)"),
    Setting("console_token", _secret, None, "the console's bearer token or basic-auth password"),
    # The loopback names only: a page reached under another name (a DNS
    # rebinding attack, a proxy) is refused until that name is listed.
    Setting(
        "console_allowed_hosts", _hosts, LOOPBACK_NAMES, "Host names the console answers to"
    ),
    # A record is about 200 bytes: 10,000 are 2 MB per log, years of a team's edits.
    Setting("audit_keep", _count, 10_000, "audit records kept per log (election, entry)"),
)

#: Every setting, as spelt in ``app.conf``.
SETTINGS = tuple(row.name for row in TABLE)

#: ``CELERY_LEADER_*`` names that are not settings: the worker names its
#: deadline table to spawned pool processes in ``CELERY_LEADER_TABLE``, and
#: its shared counter file in ``CELERY_LEADER_COUNTERS``; a process started by
#: a worker inherits both and must not warn about them.
NOT_SETTINGS = ("leader_table", "leader_counters")

#: Keys already warned about, for the whole process: beat reads its settings
#: twice, a worker once per step, and each read would warn again.
_warned: set[str] = set()


def env_name(setting: str) -> str:
    """The environment variable (and Django setting) of ``setting``: ``CELERY_LEADER_TTL``."""
    return f"CELERY_{setting.upper()}"


def namespace_of(app: Any) -> str:
    """What ``app``'s settings start with: ``"CELERY_"`` under Django's namespace, else ``""``."""
    namespace = getattr(app, "namespace", None)
    return f"{namespace}_" if namespace else ""


def spelled(setting: str, prefix: str) -> str:
    """``setting`` as spelled in ``app.conf``: ``leader_ttl``, or ``CELERY_LEADER_TTL`` (Django)."""
    return f"{prefix}{setting}".upper() if prefix else setting


def warn_unknown(keys: Iterable[str], prefix: str) -> None:
    """One WARNING per ``leader_*`` key (after ``prefix``) that is no setting, with a suggestion
    (a misspelt setting would otherwise silently leave its default)."""
    for key in keys:
        if not key.upper().startswith(f"{prefix}LEADER_".upper()):
            continue
        setting = key[len(prefix) :].lower()
        if setting in SETTINGS or setting in NOT_SETTINGS or key in _warned:
            continue
        _warned.add(key)
        # Compared without the "leader_" every name shares, which would make
        # any key look close to some setting.
        close = difflib.get_close_matches(setting[7:], [row.field for row in TABLE], n=1)
        hint = f"; did you mean {spelled('leader_' + close[0], prefix)}?" if close else ""
        logger.warning("celery-leader: unknown setting %s is ignored%s", key, hint)
