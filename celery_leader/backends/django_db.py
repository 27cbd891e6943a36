"""``django://ALIAS``: the ``DATABASES`` entry a SQL store connects to.

The PostgreSQL and MySQL stores both read it; each then checks the entry's
``ENGINE`` and turns it into its client's parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..exceptions import ConfigError
from .registry import django_alias


def django_database(url: str) -> tuple[str, Mapping[str, Any]]:
    """The alias ``url`` names and its ``settings.DATABASES`` entry.

    Raises :class:`~celery_leader.exceptions.ConfigError` in one line when
    Django is not installed, its settings are not configured or the alias is
    not there.
    """
    alias = django_alias(url)
    try:
        from django.conf import settings  # type: ignore[import-untyped]
        from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(
            f"leader_url {url!r} reads Django's DATABASES, but Django is not installed"
        ) from None
    try:
        databases = settings.DATABASES
    except ImproperlyConfigured as exc:
        raise ConfigError(
            f"leader_url {url!r}: Django settings are not configured ({exc})"
        ) from None
    database = databases.get(alias)
    if database is None:
        raise ConfigError(
            f"leader_url {url!r}: settings.DATABASES has no {alias!r} "
            f"(it has {', '.join(map(repr, databases)) or 'none'})"
        )
    return alias, database
