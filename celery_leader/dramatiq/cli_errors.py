"""Configuration errors in one line under the ``dramatiq`` command, as in the standalone scheduler.

``dramatiq`` catches only ``ImportError`` and broker connection errors while a process
imports the app (anything else: a 30-line traceback), so a ``ConfigError`` there is
one CRITICAL line and ``dramatiq``'s exit status for a failed import (2).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from ..exceptions import ConfigError

logger = logging.getLogger(__name__)

#: ``dramatiq.cli.RET_IMPORT``: "module import(s) failed or invalid command line argument".
RET_IMPORT = 2

#: The functions of ``dramatiq.cli`` that run a worker or a fork process.
_CLI_PROCESSES = {"worker_process", "fork_process"}

P = ParamSpec("P")
R = TypeVar("R")


def one_line_errors(func: Callable[P, R]) -> Callable[P, R]:
    """``func``, whose ``ConfigError`` ends a ``dramatiq`` worker or fork process in one line."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            if not under_dramatiq_cli():
                raise
            logger.critical("celery-leader: %s", exc)
            raise SystemExit(RET_IMPORT) from None

    return wrapper


def under_dramatiq_cli() -> bool:
    """Whether a ``dramatiq`` worker or fork process is on the call stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if (
            frame.f_code.co_name in _CLI_PROCESSES
            and frame.f_globals.get("__name__") == "dramatiq.cli"
        ):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
