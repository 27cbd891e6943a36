"""Sentry Crons check-ins from the run ledger (``leader_sentry_crons``): ``in_progress`` when
a slot's body starts here, ``ok`` or ``error`` when it ends (slots not run send nothing),
through the process's ``sentry_sdk``; a check-in that fails never touches the body."""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from ..exceptions import ConfigError
from .records import FAILURE, SUCCESS

logger = logging.getLogger(__name__)

#: Sentry's limit on a monitor slug.
SLUG_MAX = 50


def monitor_slug(entry: str) -> str:
    """The Sentry monitor slug of an entry (lowercase, dashes), at most :data:`SLUG_MAX` long."""
    slug = re.sub(r"[^a-z0-9_]+", "-", entry.lower()).strip("-")
    return slug[:SLUG_MAX].rstrip("-") or "celery-leader"


def require() -> None:
    """Fail in one line when ``leader_sentry_crons`` is on and sentry_sdk is missing."""
    try:
        import sentry_sdk.crons  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError(
            "leader_sentry_crons is on, but sentry-sdk is not installed: pip install sentry-sdk"
        ) from None


class SentryCrons:
    """The check-ins of one worker process."""

    def __init__(self) -> None:
        require()
        from sentry_sdk.crons import MonitorStatus, capture_checkin

        self._capture = capture_checkin
        self._status = MonitorStatus
        self._lock = threading.Lock()
        #: Slot -> the id of its open check-in (a retry in this process reuses it).
        self._open: dict[str, str] = {}

    def started(self, slot: str, entry: str) -> None:
        """``slot``'s body starts here: check in ``in_progress``."""
        with self._lock:
            if slot in self._open:
                return  # a retry of a run that already checked in here
        check_in = self._send(entry, None, self._status.IN_PROGRESS, None)
        if check_in is not None:
            with self._lock:
                self._open[slot] = check_in

    def ended(self, slot: str, entry: str, outcome: str, duration: float) -> None:
        """``slot``'s body ended with ``outcome``: check in ``ok`` or ``error``."""
        if outcome not in (SUCCESS, FAILURE):
            return
        with self._lock:
            check_in = self._open.pop(slot, None)
        status = self._status.OK if outcome == SUCCESS else self._status.ERROR
        self._send(entry, check_in, status, duration)

    def _send(
        self, entry: str, check_in: str | None, status: str, duration: float | None
    ) -> str | None:
        try:
            sent: Any = self._capture(
                monitor_slug=monitor_slug(entry),
                check_in_id=check_in,
                status=status,
                duration=duration,
            )
        except Exception as exc:  # a monitoring failure must not fail the slot
            logger.warning("celery-leader: Sentry check-in of %r failed: %s", entry, exc)
            return None
        return sent if isinstance(sent, str) else None
