"""Moved: the lease is :class:`celery_leader.Lease` (``celery_leader.election``)."""

import warnings

from .election.lease import Lease

__all__ = ["Lease"]

warnings.warn(
    "celery_leader.lease is deprecated: import Lease from celery_leader",
    DeprecationWarning,
    stacklevel=2,
)
