"""Start-up checks: bad settings end a process in one line, before it runs.

A process reads its settings and builds its store (without contacting it) as
it starts, so that a store it cannot build (a directory it cannot create,
``django://`` on a database that is not PostgreSQL) fails there, in one line,
rather than on the first renewal in a loop that logs it with a traceback.

Under Celery's command line (a click command is running) the error becomes a
``click.ClickException``: click prints it as one ``Error: ...`` line on stderr
and exits with :data:`EXIT_SETTINGS`. Celery gives a scheduler no other clean
way out: ``beat`` logs any other exception with its traceback, and a
``SystemExit`` raised from a scheduler ends beat with status 0.
"""

from __future__ import annotations

from typing import Any

from .backends import create_backend
from .config import LeaderConfig, namespace_of, spelled
from .exceptions import ConfigError

#: Exit status of a process stopped by bad settings (click's usage error and
#: ``dramatiq``'s failed import use it too).
EXIT_SETTINGS = 2


def check_store(config: LeaderConfig, url_setting: str = "leader_url") -> None:
    """Build ``config``'s store and close it again: a URL it cannot serve raises here.

    The store's message names ``leader_url``; it is given as ``url_setting``,
    the name the user wrote (``CELERY_LEADER_URL``, ``url=``).
    """
    try:
        backend = create_backend(config)
    except ConfigError as exc:
        message = str(exc)
        if message.startswith("leader_url") and url_setting != "leader_url":
            message = url_setting + message.removeprefix("leader_url")
        raise ConfigError(message) from None
    backend.close()


def app_config(app: Any) -> LeaderConfig:
    """The checked settings of a Celery ``app``, store built once; one line under click."""
    try:
        config = LeaderConfig.from_app(app)
        check_store(config, spelled("leader_url", namespace_of(app)))
    except ConfigError as exc:
        raise for_cli(exc) from None
    return config


def for_cli(exc: ConfigError) -> Exception:
    """``exc`` as the command line should show it: one line under click, else itself."""
    try:
        import click
    except ModuleNotFoundError:
        return exc
    if click.get_current_context(silent=True) is None:
        return exc

    class SettingsError(click.ClickException):
        exit_code = EXIT_SETTINGS

    return SettingsError(str(exc))
