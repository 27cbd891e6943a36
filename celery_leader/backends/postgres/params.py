"""``leader_url`` -> libpq connection parameters, with the store's defaults."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ...exceptions import ConfigError
from ..urls import mask_url
from .sql import ms


def connection_params(
    url: str, timeout: float, given: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], str]:
    """libpq parameters for ``url`` (or ``given``, from Django's ``DATABASES``), and how
    to name the target in messages (no password); keepalive and connect defaults come
    from the store deadline ``timeout``, and what the URL or ``given`` say wins."""
    if given is None:
        params, target = _url_params(url), mask_url(url)
    else:
        params = dict(given)
        where = params.get("host") or "the local socket"
        target = f"{url} (database {params.get('dbname', '?')!r} on {where})"
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
