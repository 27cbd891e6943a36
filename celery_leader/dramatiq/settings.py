"""``LeaderMiddleware`` arguments -> a validated :class:`~celery_leader.LeaderConfig`;
one not given is read from ``CELERY_LEADER_*`` (Django settings when configured: django_dramatiq
builds middleware without arguments; else the environment)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..backends.registry import store_hints
from ..exceptions import ConfigError
from ..settings.config import SETTINGS, LeaderConfig, env_name, warn_unknown
from ..settings.startup import check_store


def load_config(arguments: Mapping[str, Any]) -> LeaderConfig:
    """Validate ``arguments`` (``None`` = not given), completed from Django or the environment."""
    overrides = {f"leader_{k}": v for k, v in arguments.items() if v is not None}
    names = {key: f"{key.removeprefix('leader_')}=" for key in overrides}
    environ = _django_settings()
    if "leader_url" not in overrides and not (environ or os.environ).get(env_name("leader_url")):
        raise ConfigError(
            f"LeaderMiddleware needs url= (or {env_name('leader_url')}): {store_hints()}"
        )
    config = LeaderConfig.from_env(environ, names, **overrides)
    # Settings Dramatiq cannot honour fail in one line, rather than doing nothing.
    if config.fence_tasks:
        raise ConfigError(
            f"{env_name('leader_fence_tasks')} is for Celery workers only (Dramatiq's "
            "leader-only actors check leadership as each message runs): unset it"
        )
    if config.crontab_dst != "cron":
        raise ConfigError(
            f"{env_name('leader_crontab_dst')} = {config.crontab_dst!r} is for Celery crontab "
            "entries only (Dramatiq's cron() always follows cron's clock-change rules): unset it"
        )
    # A store that cannot be built fails with the app's import, in one line.
    check_store(config, names.get("leader_url", env_name("leader_url")))
    return config


def _django_settings() -> dict[str, str] | None:
    """``CELERY_LEADER_*`` of configured Django settings; ``None`` without Django."""
    try:
        from django.conf import settings  # type: ignore[import-untyped]
    except ImportError:
        return None
    if not settings.configured:
        return None
    warn_unknown(dir(settings), "CELERY_")
    values = {env_name(key): getattr(settings, env_name(key), None) for key in SETTINGS}
    return {key: value for key, value in values.items() if value is not None}
