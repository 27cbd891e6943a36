"""Who leads, as seen from this process: the registry behind ``is_leader()``.

A check is answered, in this order, by a test's pin (:mod:`celery_leader.election.pins`),
the worker's deadline table (:mod:`celery_leader.celery.deadline_table`), else a
lease of this process (``@leader_only`` on a plain function joins on first use;
:func:`is_leader` never joins). Each (app, election) resolves once to a cached
:class:`View`, except a lease another part of this process joined, and "no lease".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..election import body_epoch
from ..election.lease import Lease
from ..election.lease_set import Membership, lease_set
from ..election.pins import on_reset, role_of, watch
from ..exceptions import NotLeader, StoreUnavailable, missing_extra
from ..probes import metrics
from ..settings.config import LeaderConfig, validate_name
from ..settings.process import after_fork_in_child
from . import deadline_table
from .signals import SIGNALS

try:
    from celery import signals
    from celery._state import get_current_app
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "celery") from None

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class View:
    """This process's view of one election: two cheap calls, no I/O."""

    #: The election's name.
    election: str
    #: True while this process (or its worker) leads.
    leads: Callable[[], bool]
    #: The fencing token of the current term while leading, else None.
    epoch: Callable[[], int | None]


# Elections named by decorated functions in this process; the worker joins
# them all (plus leader_worker_election) when it starts.
_named: set[str] = set()

# (app, election as asked: None = the app's default) -> view.
_views: dict[tuple[Any, str | None], View] = {}

#: ``cached_view((app, election))``: the resolved view, or ``None`` before
#: :func:`view` resolved it. ``@leader_only``'s hot path: one dict lookup in C,
#: no Python frame.
cached_view = _views.get
_configs: dict[Any, LeaderConfig] = {}
# This module's memberships of elections (the leases live in the process's lease set).
_joined: dict[tuple[LeaderConfig, str], Membership] = {}
_lock = threading.RLock()


def name_election(election: str) -> None:
    """Record that a function of this process uses ``election`` (the worker joins it)."""
    _named.add(election)


def named_elections() -> frozenset[str]:
    """Elections named by decorated functions imported so far."""
    return frozenset(_named)


def config_of(app: Any) -> LeaderConfig:
    """The validated settings of ``app``, read once per process."""
    config = _configs.get(app)
    if config is None:
        config = _configs[app] = LeaderConfig.from_app(app)
    return config


def view(app: Any, election: str | None) -> View:
    """The cached view of ``election`` (``None``: the app's default) for ``app``.

    ``@leader_only``'s: outside a worker, the first call joins the election.
    """
    try:
        return _views[app, election]
    except KeyError:
        return _resolve(app, election, join=True)


def is_leader(election: str | None = None, *, app: Any = None) -> bool:
    """True while this process (or its worker) leads ``election``.

    Never joins an election nor talks to the store: it answers from a lease this
    process already takes part in, else ``False``. ``election`` defaults to
    ``leader_worker_election`` and ``app`` to the current Celery app.
    """
    return _view_for(election, app).leads()


def current_epoch(election: str | None = None, *, app: Any = None) -> int | None:
    """The fencing token of this process's term of ``election``; ``None`` when not leading.

    Answered like :func:`is_leader`. In a ``@leader_only`` body of ``election``, the
    epoch its check let it through with, even once the term has ended.
    """
    found = _view_for(election, app)
    passed = body_epoch.of(found.election)
    return found.epoch() if passed is None else passed


def ensure_leader(election: str | None = None, *, app: Any = None) -> None:
    """Raise :class:`~celery_leader.exceptions.NotLeader` unless this process leads ``election``
    (as cheap as :func:`is_leader`: call it before each side effect of a long body)."""
    app = get_current_app() if app is None else app
    if not _view_for(election, app).leads():
        name = config_of(app).worker_election if election is None else election
        raise NotLeader(
            f"this process does not lead {name!r} (any more): stop before the next "
            "side effect; another instance may lead by now"
        )


def forget_views() -> None:
    """Drop cached views so the next check resolves again (a table appeared or went)."""
    with _lock:
        _views.clear()


def stop_local_leases() -> None:
    """Leave the elections this process joined by itself: another takes over at once."""
    with _lock:
        joined = list(_joined.values())
        _joined.clear()
        _views.clear()
    for membership in joined:
        try:
            membership.leave()
        except Exception:  # best effort: often called while the interpreter exits
            logger.debug(
                "celery-leader: could not leave %r", membership.lease.election, exc_info=True
            )


def reset() -> None:
    """Forget everything this process learnt: leases it joined, stores, settings, views
    (between tests)."""
    stop_local_leases()  # leaving a set's last election closes its store connection
    with _lock:
        _configs.clear()


def _view_for(election: str | None, app: Any) -> View:
    """The view :func:`is_leader` answers from: never joins."""
    if election is not None:
        validate_name("election", election)
    app = get_current_app() if app is None else app
    try:
        return _views[app, election]
    except KeyError:
        return _resolve(app, election, join=False)


def _never() -> bool:
    return False


def _no_epoch() -> int | None:
    return None


def _resolve(app: Any, key: str | None, *, join: bool) -> View:
    with _lock:
        found = _views.get((app, key))
        if found is not None:
            return found
        config = config_of(app)
        election = config.worker_election if key is None else key
        pin = role_of(election)
        if pin is not None:
            # A test pinned the role (celery_leader.election.pins): no table, no lease.
            found = View(election, lambda: pin.leads, lambda: pin.epoch)
            _views[app, key] = found
            return found
        table = deadline_table.process_table()
        if table is not None and table.store != deadline_table.store_id(
            config.url, config.key_prefix
        ):
            table = None  # another app's worker: its leases are not ours
        index = None if table is None else table.index(election)
        if table is not None and index is not None:
            found = View(election, table.checker(index), table.epoch_reader(index))
        elif join:
            lease = _local_lease(app, election)
            found = View(election, lease.is_leader, lambda: lease.epoch)
        else:
            # Not cached: the lease may leave, or this process join later.
            held = lease_set(config).lease_of(election)
            if held is None:
                # Not leading, from no lease: what a process that does not take part answers.
                return View(election, _never, _no_epoch)
            return View(election, held.is_leader, lambda: held.epoch)
        _views[app, key] = found
        return found


def _local_lease(app: Any, election: str) -> Lease:
    """Join ``election`` from this process, once, and wait (at most one store timeout)
    for the first outcome, so that the first call already knows whether it leads."""
    config = config_of(app)
    found = _joined.get((config, election))
    if found is not None:
        return found.lease
    decided = threading.Event()
    leases = lease_set(config)
    membership = leases.join(
        election,
        on_change=lambda _lease: decided.set(),
        observers=(SIGNALS, metrics.OBSERVER),
        start=False,
    )
    _joined[config, election] = membership
    lease = membership.lease
    logger.info(
        "celery-leader: %s joins election %r from this process (store %s)",
        config.instance_id,
        election,
        config.display_url,
    )
    lease.start()
    deadline = time.monotonic() + leases.store.timeout
    while not decided.wait(0.01) and time.monotonic() < deadline:
        try:
            holder = lease.holder()
        except StoreUnavailable:
            break
        if holder is not None and holder.instance_id != config.instance_id:
            break
    return lease


def _after_fork_in_child() -> None:
    # The parent's lease threads do not exist here and their deadlines would
    # freeze; the child resolves again (table if trusted, else its own lease).
    global _lock
    _lock = threading.RLock()
    _views.clear()
    _joined.clear()


after_fork_in_child(_after_fork_in_child)
watch(forget_views)
on_reset(reset)


def _open_table(**_: Any) -> None:
    """Map the worker's table as a pool process starts (a spawned one then keeps it
    even if the worker removes the file while shutting down)."""
    deadline_table.process_table()
    forget_views()


signals.worker_process_init.connect(
    _open_table, weak=False, dispatch_uid="celery_leader.open_table"
)
