"""``leader_url`` -> PyMySQL connection parameters: a MySQL/MariaDB URL, or a Django alias."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..._urls import mask_url, scheme_of
from ...exceptions import ConfigError
from ..django_db import django_database

#: URL query parameters, as PyMySQL names them: TLS, and a local socket.
_STRING_QUERY = ("ssl_ca", "ssl_cert", "ssl_key", "ssl_key_password", "unix_socket")
_BOOL_QUERY = ("ssl_verify_cert", "ssl_verify_identity", "ssl_disabled")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

DEFAULT_PORT = 3306


def connection_params(url: str) -> tuple[dict[str, Any], str]:
    """PyMySQL parameters for ``url``, and how to name the target in messages (no password)."""
    if scheme_of(url) == "django":
        return _django_params(url)
    return _url_params(url), mask_url(url)


def _url_params(url: str) -> dict[str, Any]:
    """``mysql://user:password@host:port/database?ssl_ca=...`` (``mariadb://`` alike)."""
    parts = urlsplit(url)
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise ConfigError(
            f"leader_url {mask_url(url)!r} names no database: "
            "mysql://user:password@host:port/database"
        )
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ConfigError(f"leader_url {mask_url(url)!r} has an invalid port") from None
    params: dict[str, Any] = {
        "host": parts.hostname or "localhost",
        "port": port,
        "database": database,
    }
    if parts.username:
        params["user"] = unquote(parts.username)
    if parts.password:
        params["password"] = unquote(parts.password)
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _STRING_QUERY:
            params[key] = value
        elif key in _BOOL_QUERY and value.lower() in _TRUE + _FALSE:
            params[key] = value.lower() in _TRUE
        else:
            known = ", ".join(_STRING_QUERY + _BOOL_QUERY)
            raise ConfigError(
                f"leader_url {mask_url(url)!r}: unknown or invalid query parameter "
                f"{key}={value!r} (known: {known}; booleans are true or false)"
            )
    return params


def _django_params(url: str) -> tuple[dict[str, Any], str]:
    """PyMySQL parameters of ``settings.DATABASES[alias]`` for ``django://alias``.

    Django's MySQL backend (mysqlclient) takes TLS as ``OPTIONS["ssl"]`` =
    ``{"ca": ..., "cert": ..., "key": ...}``; ``unix_socket`` and
    ``read_default_file`` are read too. The other OPTIONS (``init_command``,
    ``charset``, ``isolation_level`` ...) shape Django's own connections only.
    """
    alias, database = django_database(url)
    engine = str(database.get("ENGINE", ""))
    if not engine.endswith(".mysql"):
        raise ConfigError(
            f"leader_url {url!r}: DATABASES[{alias!r}] uses ENGINE {engine!r}, not "
            "django.db.backends.mysql"
        )
    options = database.get("OPTIONS") or {}
    params: dict[str, Any] = {}
    for key, setting in (
        ("database", "NAME"),
        ("user", "USER"),
        ("password", "PASSWORD"),
        ("host", "HOST"),
    ):
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
    where = params.get("host") or params.get("unix_socket") or "localhost"
    return params, f"{url} (database {params['database']!r} on {where})"
