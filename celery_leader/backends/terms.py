"""The term record every store keeps, and the one policy for values it cannot read.

A term is the JSON object ``{"token", "epoch", "holder", "since"}`` (etcd keeps no
epoch: it is the key's create revision). A foreign term or epoch is never taken for
free: every call that needs it raises :class:`StoreUnavailable` (:func:`foreign`);
a foreign state container reads as empty (:func:`unreadable_state`) and the next
fenced claim replaces it.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from ..exceptions import StoreUnavailable
from .lock import HolderInfo, Term

logger = logging.getLogger(__name__)


def new_term(epoch: int, instance_id: str, since: float, **extra: object) -> Term:
    """A fresh term of ``instance_id`` with ``epoch``, begun at ``since`` (built here)."""
    token = {
        "token": uuid.uuid4().hex,
        "epoch": epoch,
        "holder": instance_id,
        "since": since,
        **extra,
    }
    return Term(json.dumps(token), epoch, since)


def foreign(where: str, found: object, expected: str) -> StoreUnavailable:
    """The error for a value celery-leader cannot read where it keeps a term or an epoch."""
    shown = found[:80] if isinstance(found, str) else found
    return StoreUnavailable(
        f"{where} holds {shown!r}, not {expected}: celery-leader did not write it; "
        "nobody can lead this election until it expires or is removed"
    )


def parse_term(value: str, where: str) -> dict[str, Any]:
    """The stored term ``value`` read from ``where`` (a key or file, for the error)."""
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("epoch"), int)
        or not isinstance(data.get("token"), str)
    ):
        raise foreign(where, value, "a celery-leader term (JSON with token and integer epoch)")
    return data


def holder_info(value: str, where: str, ttl_remaining: float | None) -> HolderInfo:
    """:class:`HolderInfo` of the stored term ``value``."""
    data = parse_term(value, where)
    return HolderInfo(
        str(data.get("holder", "?")), data["epoch"], ttl_remaining, since=since_of(data)
    )


def since_of(data: object) -> float | None:
    """The ``since`` of a stored term (JSON text or parsed); ``None``: none or unreadable."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return None
    since = data.get("since") if isinstance(data, dict) else None
    if isinstance(since, bool) or not isinstance(since, (int, float)):
        return None
    return float(since)


def parse_epoch(text: str, where: str) -> int:
    """A stored epoch counter; anything but a non-negative integer is foreign."""
    try:
        epoch = int(text)
    except ValueError:
        epoch = -1
    if epoch < 0:
        raise foreign(where, text, "an epoch counter (a non-negative integer)")
    return epoch


def unreadable_state(where: str, found: object) -> dict[str, str]:
    """Log a schedule state container celery-leader cannot read; it reads as empty."""
    logger.error(
        "celery-leader: %s holds %.80r, not schedule state (entry -> JSON string); "
        "reading it as empty, the next claim replaces it",
        where,
        found,
    )
    return {}
