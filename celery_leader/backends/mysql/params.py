"""``leader_url`` -> PyMySQL connection parameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...exceptions import ConfigError
from ..urls import mask_url

#: URL query parameters, as PyMySQL names them: TLS, and a local socket.
_STRING_QUERY = ("ssl_ca", "ssl_cert", "ssl_key", "ssl_key_password", "unix_socket")
_BOOL_QUERY = ("ssl_verify_cert", "ssl_verify_identity", "ssl_disabled")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

DEFAULT_PORT = 3306


def connection_params(
    url: str, given: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], str]:
    """PyMySQL parameters for ``url`` (or ``given``), and the target as messages name it."""
    if given is None:
        return _url_params(url), mask_url(url)
    where = given.get("host") or given.get("unix_socket") or "localhost"
    return dict(given), f"{url} (database {given['database']!r} on {where})"


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
