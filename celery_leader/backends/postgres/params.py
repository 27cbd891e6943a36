"""``leader_url`` -> libpq connection parameters: a PostgreSQL URL, or a Django alias."""

from __future__ import annotations

import math
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..._urls import mask_url, scheme_of
from ...exceptions import ConfigError
from ..django_db import django_database
from .sql import ms

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


def connection_params(url: str, timeout: float) -> tuple[dict[str, Any], str]:
    """libpq parameters for ``url``, and how to name the target in messages (no password).

    ``timeout`` is the store deadline; the keepalive and connect defaults are
    derived from it. What the URL or Django's ``OPTIONS`` say wins.
    """
    if scheme_of(url) == "django":
        params, target = _django_params(url)
    else:
        params, target = _url_params(url), mask_url(url)
    # The libpq keepalives and tcp_user_timeout let a client notice a dead
    # server or network within about two store deadlines even while it sends nothing.
    params.setdefault("application_name", "celery-leader")
    params.setdefault("connect_timeout", str(max(2, math.ceil(timeout))))  # libpq minimum: 2
    params.setdefault("keepalives", "1")
    params.setdefault("keepalives_idle", str(max(1, math.ceil(timeout))))
    params.setdefault("keepalives_interval", str(max(1, math.ceil(timeout / 3))))
    params.setdefault("keepalives_count", "3")
    params.setdefault("tcp_user_timeout", ms(timeout))
    return params, target


def _url_params(url: str) -> dict[str, Any]:
    try:
        return dict(conninfo_to_dict(url))
    except psycopg.Error as exc:
        detail = mask_url(" ".join(str(exc).split()))
        raise ConfigError(
            f"leader_url {mask_url(url)!r} is not a valid PostgreSQL URL: {detail}"
        ) from None


def _django_params(url: str) -> tuple[dict[str, Any], str]:
    """libpq parameters of ``settings.DATABASES[alias]`` for ``django://alias``."""
    alias, database = django_database(url)
    engine = str(database.get("ENGINE", ""))
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
    for key, setting in (
        ("dbname", "NAME"),
        ("user", "USER"),
        ("password", "PASSWORD"),
        ("host", "HOST"),
        ("port", "PORT"),
    ):
        if database.get(setting):
            params[key] = str(database[setting])
    where = params.get("host") or "the local socket"
    return params, f"{url} (database {params.get('dbname', '?')!r} on {where})"
