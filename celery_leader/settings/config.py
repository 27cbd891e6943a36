"""Settings -> a validated :class:`LeaderConfig`, read row by row from the settings table.

Read from ``app.conf`` (``CELERY_LEADER_TTL`` and so on under Django's namespace), the
environment or arguments; a bad value fails at startup in one line naming the setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..backends.registry import Store, store_for, store_hints
from ..backends.urls import mask_url, scheme_of
from ..contrib.django_db import django_database
from ..election.timing import MAX_TTL, check_timing, check_ttl, store_timeout
from ..exceptions import ConfigError

# A name imported "as" itself is for other modules, which import it from here.
from .table import DEFAULT_KEY_PREFIX as DEFAULT_KEY_PREFIX
from .table import DEFAULT_LEDGER_RETENTION as DEFAULT_LEDGER_RETENTION
from .table import DEFAULT_TTL as DEFAULT_TTL
from .table import LOOPBACK_NAMES as LOOPBACK_NAMES
from .table import MISSED_SLOTS as MISSED_SLOTS
from .table import OVERLAP as OVERLAP
from .table import SETTINGS as SETTINGS
from .table import TABLE, deployment_of
from .table import env_name as env_name
from .table import namespace_of as namespace_of
from .table import spelled as spelled
from .table import validate_grace as validate_grace
from .table import validate_missed_slots as validate_missed_slots
from .table import validate_name as validate_name
from .table import warn_unknown as warn_unknown
from .views import (
    ConsoleSettings,
    ElectionSettings,
    LedgerSettings,
    ProbeSettings,
    SchedulerSettings,
    View,
)


@dataclass(frozen=True, kw_only=True)
class LeaderConfig(
    ConsoleSettings, ProbeSettings, LedgerSettings, SchedulerSettings, ElectionSettings
):
    """The validated ``leader_*`` settings of one app: every consumer's view in one.

    Each field is the setting ``leader_<field>``, but ``deployment``; what each
    means, its default and how it is read: :data:`celery_leader.settings.table.TABLE`.
    """

    worker_election: str
    fence_tasks: bool

    @property
    def store_timeout(self) -> float:
        """Deadline of every store call, in seconds (see :func:`store_timeout`)."""
        return store_timeout(self.ttl, self.renew_interval)

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
        """The kind of store ``url`` selects (``"redis"``, ...: ``backends.STORES``)."""
        return self.store.kind

    #: Each consumer's settings, as a frozen copy (see :mod:`celery_leader.settings.views`).
    election = View(ElectionSettings)
    scheduler = View(SchedulerSettings)
    run_ledger = View(LedgerSettings)
    probes = View(ProbeSettings)
    console = View(ConsoleSettings)

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

        ``overrides`` (``leader_ttl=...``; ``None``: not given) win over the environment;
        an error names the variable, or the override as ``names`` spells it (``"ttl="``).
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
        spelt = {**{key: key for key in SETTINGS}, **(names or {})}
        got: dict[str, Any] = {"broker_url": broker_url}
        for row in TABLE:
            default = row.default(got) if callable(row.default) else row.default
            got[row.field] = row.read(spelt[row.name], values.get(row.name), default)
            _bounds(row.field, got, spelt)
        del got["broker_url"]
        return cls(**got, deployment=deployment_of(broker_url))


def _bounds(field: str, got: Mapping[str, Any], spelt: Mapping[str, str]) -> None:
    """Check the bounds that tie ``field``, just read, to the settings read before it."""
    value, ttl, name = got[field], got.get("ttl", 0.0), spelt[f"leader_{field}"]
    if field == "renew_interval":
        check_timing(ttl, value, spelt["leader_ttl"], name)
        check_ttl(ttl, value, spelt["leader_ttl"], name)
    elif field == "tick_timeout" and value is not None and value > MAX_TTL:
        raise ConfigError(f"{name} must be at most {MAX_TTL:,.0f} s (got {value:g})")
    # A record must outlive the liveness it carries (one ttl) many times over,
    # or a second delivery could find no record and run the slot again.
    elif field == "ledger_retention" and value < 60 * ttl:
        raise ConfigError(
            f"{name} must be at least 60 x leader_ttl ({60 * ttl:g} s), got {value:g}"
        )
