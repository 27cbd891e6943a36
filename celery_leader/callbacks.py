"""Moved: :class:`Callbacks` and :class:`Observer` are in ``celery_leader.election.events``."""

import warnings

from .election.events import NO_CALLBACKS, Callbacks, Observer

__all__ = ["NO_CALLBACKS", "Callbacks", "Observer"]

warnings.warn(
    "celery_leader.callbacks is deprecated: import from celery_leader.election.events",
    DeprecationWarning,
    stacklevel=2,
)
