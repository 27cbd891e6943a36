"""Start-up check of the store: one that cannot be built fails as the process starts.

A process reads its settings and builds its store (without contacting it) as
it starts, so that a store it cannot build (a directory it cannot create,
``django://`` on a database that is not PostgreSQL) fails there, in one line,
rather than on the first renewal in a loop that logs it with a traceback.
"""

from __future__ import annotations

from ..backends import open_store
from ..exceptions import ConfigError
from .config import LeaderConfig


def check_store(config: LeaderConfig, url_setting: str = "leader_url") -> None:
    """Build ``config``'s store and close it again: a URL it cannot serve raises here.

    The store's message names ``leader_url``; it is given as ``url_setting``,
    the name the user wrote (``CELERY_LEADER_URL``, ``url=``).
    """
    try:
        store = open_store(config)
    except ConfigError as exc:
        message = str(exc)
        if message.startswith("leader_url") and url_setting != "leader_url":
            message = url_setting + message.removeprefix("leader_url")
        raise ConfigError(message) from None
    store.close()
