"""Run now: a request any process writes to the store, that the leader runs under its term.

A request is a record among the election's schedule entries
(:class:`~celery_leader.backends.EntryStore`): writing it needs no lease, and
it moves the entries version the leader already asks about every tick, so an
idle schedule pays nothing for it. Its key, ``~run.`` and a hash of the entry
and the idempotency key, can never be an entry's name (``~`` is not allowed in
one); every reader of the entries leaves requests out (:func:`is_request`).

The leader (:mod:`~celery_leader.schedule.run_desk`) sends each request as a
slot of its entry, ``NAME@run:<ISO UTC>``, through the path of a scheduled
slot, and writes the outcome into the request; the requester waits for it, a
bounded time (:func:`await_outcome`). A request made again with the same key
is answered with the first one's outcome. A request no leader took within
:data:`REQUEST_TTL` of being made is dropped by the leader (outcome
``expired``), never run late; a request with its outcome is kept
:data:`OUTCOME_KEEP`, then removed by the leader.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from typing import Any

from ..backends import Edit, EntryStore
from .entries import EntryError
from .series import utc

#: Keys of run requests among the entries start with this; ``~`` is in no entry name.
PREFIX = "~run."

#: Seconds a request waits for a leader to take it. A request older than this
#: when a leader first sees it is dropped (outcome ``expired``): a run asked for
#: "now" is not sent minutes later without the requester knowing. Long enough
#: for hand-overs (a lease's ttl and a state load) and a beat restarted by a
#: deploy; short enough that "now" still means now.
REQUEST_TTL = 300.0

#: Seconds a request is kept after its outcome: the window in which the same
#: idempotency key is answered with that outcome rather than run again (a
#: double click, a retried HTTP call, a script run twice).
OUTCOME_KEEP = 3600.0

#: Seconds a requester waits for the leader's outcome by default: a leader sees
#: a request within its entries poll (half a second) and its tick.
DEFAULT_WAIT = 5.0

#: How often a waiting requester asks whether the entries changed (one cheap read).
WAIT_POLL = 0.1

#: The longest idempotency key and reason kept.
MAX_KEY, MAX_WHY = 200, 1000

#: Outcomes. ``sent``: the broker has the slot. ``refused``: the leader would not
#: send it (why says). ``expired``: no leader took it within :data:`REQUEST_TTL`.
#: ``failed``: the publish failed before anything reached the broker. ``unknown``:
#: it may be in the broker (a publish that failed mid-way, or a leader that
#: stopped between claim and publish); with the run ledger it is re-sent once.
SENT, REFUSED, EXPIRED, FAILED, UNKNOWN = "sent", "refused", "expired", "failed", "unknown"
#: What a requester reports while no outcome is recorded.
QUEUED = "queued"


def is_request(key: str) -> bool:
    """Whether entries record ``key`` is a run request (not an entry)."""
    return key.startswith(PREFIX)


def request_key(entry: str, key: str) -> str:
    """The store key of the request of ``entry`` with idempotency key ``key``
    (fixed length: entry names may be long)."""
    digest = hashlib.sha256(f"{entry}\0{key}".encode()).hexdigest()
    return f"{PREFIX}{digest[:40]}"


def run_slot(name: str, now: datetime) -> str:
    """The ``leader_slot`` of a run outside the grid: ``NAME@run:<ISO UTC>``."""
    return f"{name}@run:{utc(now).isoformat(timespec='milliseconds')}"


def run_slot_time(slot: str) -> datetime | None:
    """When the run of a :func:`run_slot` was sent for; ``None`` for any other slot."""
    _, marker, tail = slot.rpartition("@run:")
    if not marker:
        return None
    try:
        return datetime.fromisoformat(tail)
    except ValueError:
        return None


@dataclass(frozen=True)
class RunOutcome:
    """What the leader did with a request: ``state`` (one of the outcomes above),
    the slot and epoch it was sent under, why (refused, failed), and when (Unix s)."""

    state: str
    at: float
    slot: str | None = None
    epoch: int | None = None
    why: str | None = None


@dataclass(frozen=True)
class RunRequest:
    """One run-now request: of ``entry``, idempotency ``key``, made at
    ``requested_at`` (Unix seconds, the requester's clock) by ``who`` for ``why``;
    ``outcome`` once the leader dealt with it."""

    entry: str
    key: str
    requested_at: float
    who: str
    why: str | None = None
    outcome: RunOutcome | None = None

    @property
    def store_key(self) -> str:
        """Its key among the election's entries."""
        return request_key(self.entry, self.key)

    @property
    def expires_at(self) -> float:
        """When a leader drops it untaken (Unix seconds)."""
        return self.requested_at + REQUEST_TTL

    def answered(self, outcome: RunOutcome) -> RunRequest:
        """This request with its outcome."""
        return replace(self, outcome=outcome)

    def dump(self) -> str:
        """The stored form (JSON)."""
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def load(cls, text: str) -> RunRequest | None:
        """The request ``text`` holds; ``None`` when it is not one this version reads."""
        try:
            data = json.loads(text)
            outcome = data.get("outcome")
            why = data.get("why")
            return cls(
                str(data["entry"]),
                str(data["key"]),
                float(data["requested_at"]),
                str(data["who"]),
                None if why is None else str(why),
                None if outcome is None else _outcome(outcome),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def _outcome(data: dict[str, Any]) -> RunOutcome:
    epoch, slot, why = data.get("epoch"), data.get("slot"), data.get("why")
    return RunOutcome(
        str(data["state"]),
        float(data["at"]),
        None if slot is None else str(slot),
        None if epoch is None else int(epoch),
        None if why is None else str(why),
    )


@dataclass(frozen=True)
class RunResult:
    """What a requester learns: the request as last read, and whether its key had
    been used before (then the outcome is the first request's)."""

    request: RunRequest
    repeated: bool = False

    @property
    def state(self) -> str:
        """The outcome's state, or ``queued`` while there is none."""
        outcome = self.request.outcome
        return QUEUED if outcome is None else outcome.state

    @property
    def slot(self) -> str | None:
        """The ``leader_slot`` it was sent as (``None`` until sent)."""
        outcome = self.request.outcome
        return None if outcome is None else outcome.slot

    @property
    def epoch(self) -> int | None:
        """The epoch of the leader that sent it."""
        outcome = self.request.outcome
        return None if outcome is None else outcome.epoch

    def to_json(self) -> dict[str, Any]:
        """The result as the CLI prints it with ``--json``."""
        request, outcome = self.request, self.request.outcome
        return {
            "entry": request.entry,
            "key": request.key,
            "state": self.state,
            "slot": self.slot,
            "epoch": self.epoch,
            "why": None if outcome is None else outcome.why,
            "repeated": self.repeated,
            "requested_at": _iso(request.requested_at),
            "expires_at": _iso(request.expires_at) if outcome is None else None,
        }

    def text(self, waited: float) -> str:
        """One line for people; ``waited``: the seconds the requester waited."""
        request, outcome = self.request, self.request.outcome
        again = f" (key {request.key} was used before: its first request's outcome)"
        again = again if self.repeated else ""
        name = request.entry
        if outcome is None:
            return (
                f"{name}: queued as request {request.key}; no leader answered within "
                f"{waited:g} s. A leader sends it when one leads, until "
                f"{_iso(request.expires_at)} ({REQUEST_TTL:g} s after the request); "
                f"after that it is dropped, never run late{again}"
            )
        if outcome.state == SENT:
            epoch = outcome.epoch
            return f"{name}: sent by the leader (epoch {epoch}), leader_slot {outcome.slot}{again}"
        if outcome.state == UNKNOWN:
            return (
                f"{name}: slot {outcome.slot} (epoch {outcome.epoch}) may or may not have "
                f"reached the broker: {outcome.why}{again}"
            )
        if outcome.state == EXPIRED:
            return f"{name}: not run: {outcome.why}{again}"
        return f"{name}: not run ({outcome.state} by the leader): {outcome.why}{again}"


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="seconds")


def new_request(entry: str, key: str | None, who: str, why: str | None, now: float) -> RunRequest:
    """A request of ``entry`` (``key`` given, or made), checked."""
    key = uuid.uuid4().hex if key is None else key
    if not key or len(key) > MAX_KEY or not key.isprintable():
        raise EntryError(f"an idempotency key is 1-{MAX_KEY} printable characters (got {key!r})")
    if why is not None and len(why) > MAX_WHY:
        raise EntryError(f"a reason is at most {MAX_WHY} characters")
    return RunRequest(entry, key, now, who, why)


def submit(store: EntryStore, election: str, request: RunRequest) -> tuple[RunRequest, bool]:
    """Write ``request``; if its key was used before, the stored request instead
    (True). One compare-and-set, and a read when the key was used."""
    key = request.store_key
    for _ in range(3):
        (won,) = store.edit(election, [Edit(key, None, request.dump())])
        if won:
            return request, False
        text = store.load_one(election, key)
        if text is None:
            continue  # removed (kept past its time) between the two calls: write it anew
        found = RunRequest.load(text)
        if found is None:
            raise EntryError(f"the stored request of key {request.key} is unreadable")
        return found, True
    raise EntryError(f"the request of key {request.key} kept changing; try again")


def await_outcome(
    store: EntryStore,
    election: str,
    request: RunRequest,
    since: int,
    wait: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RunRequest:
    """``request`` as the leader answered it, or as it stands after ``wait`` seconds.

    ``since``: the entries version read before the request was written, so that
    an answer written meanwhile is not missed. Each poll is one cheap question
    (the entries version); the request is read only when it moved.
    """
    if request.outcome is not None:
        return request
    key = request.store_key
    deadline = clock() + wait
    seen = since
    while True:
        version = store.version(election)
        if version != seen:
            changed = store.changes_since(election, seen)
            if changed is None:
                # Read after the version: the request as it stands then, or newer.
                seen, text = version, store.load_one(election, key)
            else:
                seen, edits = changed
                text = edits.get(key)
            found = None if text is None else RunRequest.load(text)
            if found is not None:
                request = found
                if found.outcome is not None:
                    return found
        left = deadline - clock()
        if left <= 0:
            return request
        sleep(min(WAIT_POLL, left))
