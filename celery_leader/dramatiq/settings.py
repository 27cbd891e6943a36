"""``LeaderMiddleware`` arguments -> a validated :class:`~celery_leader.config.LeaderConfig`.

An argument not given is read from ``CELERY_LEADER_*``: from Django settings
when Django is configured (django_dramatiq builds middleware from a dotted path,
without arguments), else from the environment. A bad value fails in one line
naming the argument or the variable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..config import SETTINGS, LeaderConfig, env_name
from ..exceptions import ConfigError

#: ``LeaderMiddleware`` keyword arguments, in contract order.
ARGUMENTS = (
    "url",
    "ttl",
    "renew_interval",
    "key_prefix",
    "instance_id",
    "beat_election",
    "worker_election",
)


def load_config(arguments: Mapping[str, Any]) -> LeaderConfig:
    """Validate ``arguments`` (``None`` = not given), completed from Django or the environment."""
    overrides = {f"leader_{k}": v for k, v in arguments.items() if v is not None}
    try:
        return LeaderConfig.from_env(_django_settings(), **overrides)
    except ConfigError as exc:
        # from_env names variables; say "url=" for what came as an argument.
        message = re.sub(
            r"\bleader_([a-z_]+)",
            lambda m: f"{m[1]}=" if m[0] in overrides else m[0],
            str(exc),
        )
        if "CELERY_LEADER_URL is not set" in message:
            message = "LeaderMiddleware needs url= (or " + message + ")"
        raise ConfigError(message) from None


def _django_settings() -> dict[str, str] | None:
    """``CELERY_LEADER_*`` of configured Django settings; ``None`` without Django."""
    try:
        from django.conf import settings  # type: ignore[import-untyped]
    except ImportError:
        return None
    if not settings.configured:
        return None
    values = {}
    for key in SETTINGS:
        value = getattr(settings, env_name(key), None)
        if value is not None:
            values[env_name(key)] = value
    return values
