"""``django://ALIAS``: the store, and its connection parameters, that Django's
``DATABASES[ALIAS]`` names (no store reads Django's settings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..exceptions import ConfigError

#: Django ``OPTIONS`` keys that are Django's or psycopg's own, not libpq's.
_DJANGO_ONLY_OPTIONS = frozenset(
    {
        "assume_role",
        "context",
        "cursor_factory",
        "isolation_level",
        "pool",
        "prepare_threshold",
        "server_side_binding",
    }
)

#: Django's connection settings, as libpq and PyMySQL name them.
_SETTINGS = (
    ("NAME", "dbname", "database"),
    ("USER", "user", "user"),
    ("PASSWORD", "password", "password"),
    ("HOST", "host", "host"),
)


@dataclass(frozen=True)
class DjangoDatabase:
    """The store a ``django://ALIAS`` URL selects, and how its client connects."""

    #: A URL scheme of the store: ``"postgresql"`` or ``"mysql"``.
    scheme: str
    #: The store client's connection parameters: libpq's or PyMySQL's.
    connection: dict[str, Any]


def django_database(url: str) -> DjangoDatabase:
    """The store and connection parameters ``settings.DATABASES[alias]`` gives
    ``url`` (``django://alias``, ``default`` when it names none); else ConfigError."""
    parts = urlsplit(url)
    alias = parts.netloc or parts.path.strip("/") or "default"
    databases = _databases(url)
    database = databases.get(alias)
    if database is None:
        raise ConfigError(
            f"leader_url {url!r}: settings.DATABASES has no {alias!r} "
            f"(it has {', '.join(map(repr, databases)) or 'none'})"
        )
    engine = str(database.get("ENGINE", ""))
    if engine.endswith(".mysql"):
        return DjangoDatabase("mysql", _pymysql_params(url, alias, database))
    if not engine.endswith((".postgresql", ".postgis")):
        raise ConfigError(
            f"leader_url {url!r}: DATABASES[{alias!r}] uses ENGINE {engine!r}; celery-leader "
            "needs PostgreSQL (django.db.backends.postgresql)"
        )
    params: dict[str, Any] = {
        key: str(value)
        for key, value in (database.get("OPTIONS") or {}).items()
        if key not in _DJANGO_ONLY_OPTIONS
    }
    for setting, key, _ in (*_SETTINGS, ("PORT", "port", "port")):
        if database.get(setting):
            params[key] = str(database[setting])
    return DjangoDatabase("postgresql", params)


def _databases(url: str) -> Mapping[str, Mapping[str, Any]]:
    """``settings.DATABASES``; ConfigError naming ``url`` when Django cannot say."""
    try:
        from django.conf import settings  # type: ignore[import-untyped]
        from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(
            f"leader_url {url!r} reads Django's DATABASES, but Django is not installed"
        ) from None
    try:
        databases: Mapping[str, Mapping[str, Any]] = settings.DATABASES
    except ImproperlyConfigured as exc:
        raise ConfigError(
            f"leader_url {url!r}: Django settings are not configured ({exc})"
        ) from None
    return databases


def _pymysql_params(url: str, alias: str, database: Mapping[str, Any]) -> dict[str, Any]:
    """PyMySQL parameters of a ``django.db.backends.mysql`` entry (of its OPTIONS, only
    ``ssl``, ``unix_socket`` and ``read_default_file`` concern the store)."""
    options = database.get("OPTIONS") or {}
    params: dict[str, Any] = {}
    for setting, _, key in _SETTINGS:
        if database.get(setting):
            params[key] = str(database[setting])
    if database.get("PORT"):
        params["port"] = int(database["PORT"])
    if str(params.get("host", "")).startswith("/"):
        params["unix_socket"] = params.pop("host")
    for key in ("unix_socket", "read_default_file"):
        if options.get(key):
            params[key] = str(options[key])
    for key, value in (options.get("ssl") or {}).items():
        if key in ("ca", "cert", "key"):
            params[f"ssl_{key}"] = str(value)
    if not params.get("database"):
        raise ConfigError(f"leader_url {url!r}: DATABASES[{alias!r}] has no NAME")
    return params
