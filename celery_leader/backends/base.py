"""The small protocol every lease store implements.

A backend only stores and compares; it never decides who leads (that is
:mod:`celery_leader.lease`). Values it keeps are JSON strings, never pickles.
"""

from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..schedule.series import utc
from ..schedule.state import parse_state


@dataclass(frozen=True)
class Term:
    """One holder's term in office.

    ``token`` is the exact value the store keeps for this term; renew, release
    and claims compare against it, so a new term (even of the same instance)
    never matches an old one. ``epoch`` is the fencing token: it grows with every
    term of the election.
    """

    token: str
    epoch: int


@dataclass(frozen=True)
class HolderInfo:
    """What the store says about the current holder of an election.

    Stores keep ``instance_id`` and the holder's deployment as one string
    (:func:`stored_holder`); they are split here, so every store reports both.
    """

    instance_id: str
    epoch: int
    #: Seconds until the store frees the election unless renewed; ``None`` for a
    #: store that frees it only when the holder's process or session ends.
    ttl_remaining: float | None
    #: The holder's broker (``LeaderConfig.deployment``); ``None`` when it did not say.
    deployment: str | None = None

    def __post_init__(self) -> None:
        instance, sep, deployment = self.instance_id.partition(DEPLOYMENT_SEP)
        if sep:
            object.__setattr__(self, "instance_id", instance)
            object.__setattr__(self, "deployment", deployment)


#: Between instance id and deployment in what stores keep: a control character
#: that no host name, pid or Celery node name contains.
DEPLOYMENT_SEP = "\x1f"


def stored_holder(instance_id: str, deployment: str | None) -> str:
    """The holder string a store keeps for ``instance_id`` of ``deployment``."""
    return instance_id if deployment is None else f"{instance_id}{DEPLOYMENT_SEP}{deployment}"


@dataclass(frozen=True)
class Acquired:
    """Result of :meth:`Backend.acquire`.

    Exactly one of ``term`` (we hold it now) and ``holder`` (someone else
    does) is set, except that both may be ``None`` when the store could not say
    who holds it. ``retry_after`` is when a follower should try again at the
    latest (a release notification may wake it sooner).
    """

    term: Term | None
    holder: HolderInfo | None
    retry_after: float


class Renewal(enum.Enum):
    """Outcome of :meth:`Backend.renew`."""

    RENEWED = "renewed"
    LOST = "lost"  # the store holds another value: someone else's term
    RESIGN = "resign"  # renewed, but an operator asked this holder to hand over


@dataclass(frozen=True)
class Claim:
    """A fenced compare-and-set of one schedule entry's shared state.

    It succeeds only if the claimer's term is still current and the stored
    state of ``entry`` is exactly ``expected`` (``None``: nothing stored yet).
    A claim of a slot names its ``due`` instant: it also fails unless that is
    strictly after the ``last_run_at`` recorded in ``expected``, so a slot can
    never be claimed twice, whatever the scheduler's clock arithmetic did.
    Claims without ``due`` (anchoring an entry, handing a slot back) only
    compare and set.
    """

    entry: str
    expected: str | None
    new: str
    due: datetime | None = None

    def admissible(self) -> bool:
        """Whether the claim's slot is after the one its expected state records."""
        if self.due is None or self.expected is None:
            return True
        recorded = parse_state(self.expected)
        return recorded is None or recorded.last_run_at < utc(self.due)


def apply_claims(state: dict[str, str], claims: Sequence[Claim]) -> list[bool]:
    """Compare-and-set ``claims`` on ``state`` in place, in order; one result each.

    For stores that hold the state in process memory while fenced by a lock
    they already checked (memory, file).
    """
    results = []
    for c in claims:
        ok = state.get(c.entry) == c.expected
        if ok:
            state[c.entry] = c.new
        results.append(ok)
    return results


def claim_rounds(claims: Sequence[Claim]) -> list[list[int]]:
    """Claim indexes in rounds: the n-th claim of every entry goes in round n.

    For stores that evaluate a whole batch against the state before it, so a
    batch may name each entry only once (PostgreSQL statements, etcd transactions).
    """
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, c in enumerate(claims):
        n = seen.get(c.entry, 0)
        seen[c.entry] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(i)
    return rounds


class Backend(ABC):
    """A lease store. One instance may serve several elections and threads."""

    #: Extra seconds a new holder waits after winning before it believes it
    #: leads, for stores that cannot cut an old holder off on time by themselves.
    holdoff: float = 0.0

    #: How many replicas of the store must hold a claim (and a new term) before
    #: :meth:`claim` (and :meth:`acquire`) return it; ``None``: as many as the
    #: store's topology needs so that a promotion cannot roll it back ("auto").
    #: Set from ``leader_replica_acks`` by ``create_backend``; stores without
    #: replicas ignore it.
    replica_acks: int | None = None

    def __init__(self, url: str, key_prefix: str, timeout: float) -> None:
        self.url = url
        self.key_prefix = key_prefix
        #: Deadline of every store call, in seconds.
        self.timeout = timeout

    @abstractmethod
    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        """Try to take ``election`` for ``ttl`` seconds.

        The new epoch is greater than the store's last epoch *and* than
        ``min_epoch`` (the highest epoch this process has seen), so epochs keep
        growing even if the store lost its data. Raises
        :class:`~celery_leader.exceptions.StoreUnavailable`.
        """

    @abstractmethod
    def renew(self, election: str, term: Term, ttl: float) -> Renewal:
        """Extend ``term`` by ``ttl`` seconds if it is still current."""

    @abstractmethod
    def release(self, election: str, term: Term) -> None:
        """Free ``election`` if ``term`` still holds it, and wake followers."""

    @abstractmethod
    def wait(self, election: str, timeout: float, cancel: threading.Event) -> None:
        """Block until ``election`` may be free, ``timeout`` passes or ``cancel`` is set."""

    def hold(self, election: str, term: Term, timeout: float, cancel: threading.Event) -> bool:
        """Block while holding ``term`` until ``timeout`` passes or ``cancel`` is set.

        Returns False as soon as the store shows that this holder's connection
        is gone, after which another instance may take the term over at once:
        the caller must stop believing it leads. Stores that cannot tell just wait.
        """
        cancel.wait(timeout)
        return True

    @abstractmethod
    def holder(self, election: str) -> HolderInfo | None:
        """The current holder of ``election``, or ``None`` when nobody holds it."""

    @abstractmethod
    def request_resign(self, election: str) -> HolderInfo | None:
        """Ask the current holder to hand over at its next renewal; return it."""

    @abstractmethod
    def elections(self) -> list[str]:
        """Names of the elections under this key prefix that the store knows."""

    @abstractmethod
    def load_state(self, election: str) -> dict[str, str]:
        """Shared schedule state of ``election``: entry name -> JSON string."""

    def claim(self, election: str, term: Term, claims: Sequence[Claim]) -> list[bool]:
        """Apply ``claims`` in one round trip; one result per claim.

        All fail when ``term`` no longer holds ``election``. A claim that is not
        :meth:`~Claim.admissible` fails without reaching the store: the store
        compares ``expected`` with what it holds, so checking ``expected`` here is
        checking the stored state.
        """
        admitted = [i for i, c in enumerate(claims) if c.admissible()]
        results = [False] * len(claims)
        if admitted:
            applied = self.compare_and_set(election, term, [claims[i] for i in admitted])
            for i, ok in zip(admitted, applied, strict=True):
                results[i] = ok
        return results

    @abstractmethod
    def compare_and_set(
        self, election: str, term: Term, claims: Sequence[Claim]
    ) -> list[bool]:
        """The store's part of :meth:`claim`: fenced compare-and-set, one round trip.

        A claim reported won is on as many replicas as :attr:`replica_acks`
        asks; when they do not acknowledge in time the claims are handed back
        and :class:`~celery_leader.exceptions.StoreUnavailable` is raised, so
        that nothing is published on a claim that a fail-over could undo.
        """

    def leave(self, election: str) -> None:  # noqa: B027 - optional hook
        """Drop what this backend keeps for ``election`` (waiters, connections).

        Called after the lease of ``election`` stopped and released its term.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release every connection and resource of the backend."""
