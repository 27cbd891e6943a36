"""Bad settings under Celery's command line: one ``Error: ...`` line, exit status 2
(beat logs any other exception with its traceback; a ``SystemExit`` ends it with 0)."""

from __future__ import annotations

from typing import Any

from ..exceptions import ConfigError, missing_extra
from ..settings.config import LeaderConfig, namespace_of, spelled
from ..settings.startup import check_store

try:
    import click
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

#: Exit status of a process stopped by bad settings (click's usage error and
#: ``dramatiq``'s failed import use it too).
EXIT_SETTINGS = 2


class SettingsError(click.ClickException):
    """A bad setting, shown by click as one line."""

    exit_code = EXIT_SETTINGS


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
    if click.get_current_context(silent=True) is None:
        return exc
    return SettingsError(str(exc))
