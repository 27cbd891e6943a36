"""The term record every store keeps, and the one policy for values it cannot read.

A term is stored as the JSON object ``{"token", "epoch", "holder", "since"}``
(a store may add fields of its own, like the file store's ``pid``): ``token`` is random
per term, so the exact string names one term of one holder; ``epoch`` is the
fencing token; ``holder`` is the instance id; ``since`` is when the term began
(seconds since the epoch, on the store's clock where it has one; terms written
by celery-leader 0.4.0 lack it, and read as "since unknown"). Memory and file build it with
:func:`new_term`; Redis (in Lua) and PostgreSQL (in SQL) build the same object
server-side, where the epoch is decided. Redis and the file store read it back
with :func:`holder_info` / :func:`parse_term`; memory and PostgreSQL keep its
fields beside it (in process memory, in typed columns). etcd stores
``{"token", "holder", "since"}`` only: the epoch is the key's own create revision, known
once the transaction that wrote it has committed.

**Foreign values.** A value celery-leader did not write (not its JSON, not an
integer epoch, a Redis key of another type) is never taken for "free" and never
silently overwritten:

* where a *term* or an *epoch* should be, every call that needs it raises
  :class:`~celery_leader.exceptions.StoreUnavailable` naming the key or file
  and what was expected. The lease retries it like an outage: nobody leads
  that election until the value expires or an operator removes it. Taking over
  would mean overwriting what may be someone's lock, or restarting epochs.
  (Where the store's own lock is free - no flock, no advisory lock - a left-over
  record is stale by definition, and the next term replaces it.)
* the *schedule state* is returned as stored, entry -> string: beat judges the
  values, and overwrites one it cannot read with a fenced claim that expects
  exactly what it read. A state *container* celery-leader cannot read (a Redis
  key of another type, a file that is not a JSON object of strings) is logged
  at ERROR naming it and read as empty; the leader's next fenced claim replaces
  it. The state is only ever written by fenced claims, so this can skip a slot
  but never send one twice.
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
    """A fresh term of ``instance_id`` with ``epoch`` that began at ``since``, for
    stores that build it client-side."""
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
    """The ``since`` of a stored term (its JSON text, or that text parsed);
    ``None`` when it has none (a term of celery-leader 0.4.0) or is unreadable."""
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
