"""The warning that another deployment holds an election this one campaigns in."""

from __future__ import annotations

import logging

from ..backends import HolderInfo
from .events import Events, LeaseArg

logger = logging.getLogger(__name__)


class ForeignWatch(Events):
    """Says so, once per term, when the holder belongs to another deployment: deployments
    sharing a store and key prefix share every election, and one of them leads nothing.
    Holders that store no deployment (older versions) are not judged."""

    def __init__(self, url: str) -> None:
        self._url = url  # masked
        self._epoch: int | None = None  # the foreign holder's term already warned of

    def on_new_leader(self, lease: LeaseArg, holder: HolderInfo) -> None:
        if (
            holder.deployment is None
            or lease.deployment is None
            or holder.deployment == lease.deployment
            or holder.epoch == self._epoch
        ):
            return
        self._epoch = holder.epoch
        msg = (
            "celery-leader: %s cannot lead %r: it is held by %s (epoch %d) of another "
            "deployment (broker %s; this one uses %s) that shares the store %s and key "
            "prefix. Give each deployment its own leader_key_prefix (or election names)."
        )
        ours, theirs = (lease.instance_id, lease.election), (holder.instance_id, holder.epoch)
        logger.warning(msg, *ours, *theirs, holder.deployment, lease.deployment, self._url)
