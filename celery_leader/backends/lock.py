"""The lease-lock facet: terms, holders and presence of an election (values are JSON)."""

from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """One holder's term in office: ``token`` is opaque outside its store and never
    matches another term's; ``epoch`` (the fencing token) grows with every term."""

    token: str
    epoch: int
    #: When the term began, as :attr:`HolderInfo.since` reports it to others.
    since: float | None = None


@dataclass(frozen=True)
class HolderInfo:
    """The current holder of an election; stores keep ``instance_id`` and the
    deployment as one string (:func:`stored_holder`), split here."""

    instance_id: str
    epoch: int
    #: Seconds until the store frees the election unless renewed; ``None`` for a
    #: store that frees it only when the holder's process or session ends.
    ttl_remaining: float | None
    #: The holder's broker (``LeaderConfig.deployment``); ``None`` when it did not say.
    deployment: str | None = None
    #: When the term began, in seconds since the epoch on the store's clock (the
    #: winner's for file and memory); ``None`` when unknown (celery-leader 0.4.0).
    since: float | None = None

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
    """Result of :meth:`LeaseLock.acquire`: ``term`` (ours now) or ``holder``
    (someone else's; both ``None``: the store could not say), and the latest
    time a follower should try again."""

    term: Term | None
    holder: HolderInfo | None
    retry_after: float
    #: The store's clock when it answered (seconds since the epoch); ``None``
    #: for a store without a clock of its own.
    store_time: float | None = None


class Renewal(enum.Enum):
    """Outcome of :meth:`LeaseLock.renew`."""

    RENEWED = "renewed"
    LOST = "lost"  # the store holds another value: someone else's term
    RESIGN = "resign"  # renewed, but an operator asked this holder to hand over


class LeaseLock(ABC):
    """Terms, holders and presence of elections: the elector's store facet.

    Five methods a store writes (acquire, renew, release, holders,
    request_resign) and two it may (a follower's wait, store_time).
    """

    #: The store's URL, password and all: mask it before showing it.
    url: str = ""

    #: Deadline of every store call, in seconds (``StoreParams.timeout``).
    timeout: float = 1.0

    #: Extra seconds a new holder waits after winning before it believes it
    #: leads, for stores that cannot cut an old holder off on time by themselves.
    holdoff: float = 0.0

    #: How coarsely the store reports its clock with acquire and renew answers, in
    #: seconds; ``None`` for a store with no clock of its own.
    clock_resolution: float | None = None

    @abstractmethod
    def acquire(self, election: str, instance_id: str, ttl: float, min_epoch: int) -> Acquired:
        """Try to take ``election`` for ``ttl`` seconds, with an epoch above the
        store's last and ``min_epoch`` (so epochs grow even if the store lost
        its data). Raises :class:`~celery_leader.exceptions.StoreUnavailable`."""

    @abstractmethod
    def renew(self, election: str, term: Term, ttl: float) -> tuple[Renewal, float | None]:
        """Extend ``term`` by ``ttl`` if still current; with the store's clock (or ``None``)."""

    @abstractmethod
    def release(self, election: str, term: Term | None) -> None:
        """Free ``election`` if ``term`` still holds it; ``term=None``: leave the election."""

    def wait(
        self, election: str, timeout: float, cancel: threading.Event, term: Term | None = None
    ) -> bool:
        """Block until ``timeout`` passes or ``cancel`` is set.

        A follower (``term=None``) also wakes as soon as ``election`` may be
        free. A holder (``term`` given) returns False as soon as the store
        shows its connection gone (another may take over at once); stores that
        cannot tell just wait. Returns True otherwise.
        """
        if term is None:
            self._wait_free(election, timeout, cancel)
        else:
            cancel.wait(timeout)
        return True

    def _wait_free(self, election: str, timeout: float, cancel: threading.Event) -> None:
        """A follower's :meth:`wait`; a store that is never woken sooner just waits."""
        cancel.wait(timeout)

    @abstractmethod
    def holders(self, elections: Sequence[str] | None = None) -> dict[str, HolderInfo | None]:
        """The holder of each of ``elections`` (``None``: nobody); ``elections=None``: all known."""

    @abstractmethod
    def request_resign(self, election: str) -> HolderInfo | None:
        """Ask the current holder to hand over at its next renewal; return it."""

    def store_time(self, election: str) -> float | None:
        """The store's clock now (seconds since the epoch); ``None`` without a clock."""
        return None

    def holder(self, election: str) -> HolderInfo | None:
        """The current holder of ``election`` alone (``None``: nobody)."""
        return self.holders([election]).get(election)
