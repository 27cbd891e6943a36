"""Start-up check of the store: one that cannot be built fails as the process starts, in one
line, rather than on the first renewal in a loop that logs it with a traceback."""

from __future__ import annotations

from ..backends import open_store
from ..exceptions import ConfigError
from .config import LeaderConfig


def check_store(config: LeaderConfig, url_setting: str = "leader_url") -> None:
    """Build ``config``'s store and close it again: a URL it cannot serve raises here,
    naming the setting as ``url_setting`` (``CELERY_LEADER_URL``, ``url=``)."""
    try:
        store = open_store(config)
    except ConfigError as exc:
        message = str(exc)
        if message.startswith("leader_url") and url_setting != "leader_url":
            message = url_setting + message.removeprefix("leader_url")
        raise ConfigError(message) from None
    store.close()
