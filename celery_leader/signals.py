"""``celery_leader.signals.elected`` and ``.demoted``, the path users type: the
signals live in :mod:`celery_leader.celery.signals`."""

from __future__ import annotations

from .celery.signals import demoted, elected

__all__ = ["demoted", "elected"]
