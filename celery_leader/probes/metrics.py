"""Prometheus metrics of the elections in this process (the ``[metrics]`` extra).

Until :func:`serve` runs, :data:`OBSERVER`, :func:`count` and :func:`track` do
nothing, so code can use them without ``prometheus_client`` installed. A worker's
pool processes count into a shared file (:func:`share_with_pool`) its main process serves.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

from ..election.events import Observer
from ..election.lease import Lease
from ..exceptions import missing_extra
from .shared_counters import SharedCounters

#: Counters that :func:`count` accepts, and their help text.
COUNTERS = {
    "slots_sent": "Schedule slots published by this instance.",
    "claims_lost": "Slot claims the store refused (another leader, or a lost term).",
    "publish_failures": "Slots whose publish to the broker failed.",
    "slots_handed_back": "Definitely unsent slots handed back for the next leader.",
    "slots_lost": "Claimed slots that were never sent and could not be handed back.",
    "missed_slots_dropped": "Missed slots not sent because of leader_missed_slots or its grace.",
    "ledger_runs": "Slots whose body this worker started (run ledger).",
    "ledger_finished": "Slots whose body ended on this worker, success or failure (run ledger).",
    "ledger_failures": "Slots whose body failed on this worker (run ledger).",
    "ledger_duplicates": "Deliveries of a slot that had started or finished: acked, not run.",
    "ledger_reruns": "Slots run again because the worker running them died (rerun).",
    "ledger_skips": "Slots recorded skipped because the worker running them died (skip).",
    "ledger_overlap_skips": "Slots recorded skipped because their entry's last slot still ran.",
    "ledger_resends": "Slots beat sent again: unknown outcome, a dead leader's claim, not started.",
}

#: Gauges that :func:`adjust` moves, and their help text.
GAUGES = {
    "ledger_running": "Slot bodies running on this worker now (run ledger).",
}

#: Gauges read from the tracked leases at scrape time, and their help text.
_LEASE_GAUGES = (
    ("is_leader", "1 while this instance leads the election."),
    ("epoch", "Epoch (fencing token) of this instance's current or last term."),
    (
        "clock_offset_seconds",
        "The store's clock minus this host's, as the lease measured it "
        "(absent for stores without a clock and before the first sample).",
    ),
)

#: Round-trip buckets, seconds: a store call on a LAN takes about a millisecond.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _Metrics:
    def __init__(self) -> None:
        require()
        import prometheus_client as prom
        from prometheus_client.core import GaugeMetricFamily

        self.prom = prom
        self.gauge_family = GaugeMetricFamily
        self.leases: list[Lease] = []
        self.last_epoch: dict[str, int] = {}
        # Registered before the counters, so that a scrape adds what the pool
        # processes counted before the counters are collected.
        prom.REGISTRY.register(_PoolSync(self))
        self.elections = prom.Counter(
            "celery_leader_elections", "Terms this instance won.", ["election"]
        )
        self.demotions = prom.Counter(
            "celery_leader_demotions", "Terms this instance lost or left.", ["election", "reason"]
        )
        self.counters = {
            name: prom.Counter(f"celery_leader_{name}", text, ["election"])
            for name, text in COUNTERS.items()
        }
        self.gauges = {
            name: prom.Gauge(f"celery_leader_{name}", text, ["election"])
            for name, text in GAUGES.items()
        }
        #: What the pool's file held at the last scrape: (name, election) -> total.
        self.pool_seen: dict[tuple[str, str], int] = {}
        self.store_errors = prom.Counter(
            "celery_leader_store_errors", "Store calls that failed.", ["election", "operation"]
        )
        self.round_trips = prom.Histogram(
            "celery_leader_store_round_trip_seconds",
            "Duration of store calls (acquire, renew, release, load_state, claim).",
            ["election", "operation"],
            buckets=BUCKETS,
        )
        prom.REGISTRY.register(self)  # the gauges below, read at scrape time

    def collect(self) -> Iterator[Any]:
        """Gauges, read from the tracked leases at scrape time (no store call)."""
        leading, epoch, offset = (
            self.gauge_family(f"celery_leader_{name}", text, labels=["election"])
            for name, text in _LEASE_GAUGES
        )
        for lease in list(self.leases):
            leading.add_metric([lease.election], 1.0 if lease.is_leader() else 0.0)
            last = self.last_epoch.get(lease.election)
            if last is not None:
                epoch.add_metric([lease.election], float(last))
            measured = lease.store_clock.offset
            if measured is not None:
                offset.add_metric([lease.election], measured)
        yield leading
        yield epoch
        yield offset

    def describe(self) -> list[Any]:
        return []  # collected lazily: nothing to check at registration

    def add(self, name: str, election: str, amount: int) -> None:
        if name in self.gauges:
            self.gauges[name].labels(election).inc(amount)
        else:
            self.counters[name].labels(election).inc(amount)

    def sync_pool(self, pool: SharedCounters) -> None:
        """Add what the pool processes counted since the last scrape."""
        for (name, election), total in pool.read().items():
            if name not in COUNTERS and name not in GAUGES:
                continue  # written by another version of this package
            delta = total - self.pool_seen.get((name, election), 0)
            self.pool_seen[(name, election)] = total
            if delta:
                self.add(name, election, delta)

    def on_transition(self, lease: Lease, event: str, epoch: int) -> None:
        self.last_epoch[lease.election] = epoch
        if event == "elected":
            self.elections.labels(lease.election).inc()
        else:
            self.demotions.labels(lease.election, lease.last_demotion or "unknown").inc()

    def on_store_call(self, lease: Lease, operation: str, seconds: float, ok: bool) -> None:
        self.round_trips.labels(lease.election, operation).observe(seconds)
        if not ok:
            self.store_errors.labels(lease.election, operation).inc()


class _PoolSync:
    """A collector that yields nothing: at each scrape, it brings in the pool's counts."""

    def __init__(self, owner: _Metrics) -> None:
        self.owner = owner

    def collect(self) -> Iterator[Any]:
        if _pool is not None and _pool.owner == os.getpid():
            self.owner.sync_pool(_pool)
        return iter(())

    def describe(self) -> list[Any]:
        return []


_metrics: _Metrics | None = None
#: The process that serves :data:`_metrics` (a forked child inherits the object).
_metrics_pid = 0
_servers: dict[int, Any] = {}
_lock = threading.Lock()
#: This process's mapping of its worker's shared counter file, if any.
_pool: SharedCounters | None = None
_pool_pid = 0


def require() -> None:
    """Fail now, in one line naming the ``[metrics]`` extra, if ``prometheus_client`` is missing."""
    try:
        import prometheus_client  # noqa: F401
    except ModuleNotFoundError as exc:
        raise missing_extra(exc, "metrics") from None


def serve(port: int, addr: str = "0.0.0.0") -> None:  # noqa: S104 - probes come from outside
    """Create the metrics and serve them over HTTP on ``port`` (once per process and port);
    :class:`~celery_leader.exceptions.MissingExtra` or :class:`OSError` (port taken)."""
    global _metrics, _metrics_pid
    with _lock:
        if _metrics is None:
            _metrics = _Metrics()
        if _metrics_pid != os.getpid():
            # First call here, or in a forked child: this process serves from now
            # on, and its parent's HTTP servers did not come along.
            _metrics_pid = os.getpid()
            _servers.clear()
        if port not in _servers:
            _servers[port] = _metrics.prom.start_http_server(port, addr=addr)


def _on_transition(lease: Lease, event: str, epoch: int) -> None:
    if _metrics is not None:
        _metrics.on_transition(lease, event, epoch)


def _on_store_call(lease: Lease, operation: str, seconds: float, ok: bool) -> None:
    if _metrics is not None:
        _metrics.on_store_call(lease, operation, seconds, ok)


#: Counts the elections, demotions and store calls of the leases it observes
#: (nothing before :func:`serve`).
OBSERVER = Observer(on_transition=_on_transition, on_store_call=_on_store_call)


def track(lease: Lease) -> None:
    """Report the ``is_leader`` and ``epoch`` gauges of ``lease`` (no-op before :func:`serve`)."""
    if _metrics is not None and lease not in _metrics.leases:
        _metrics.leases.append(lease)


def untrack(lease: Lease) -> None:
    """Stop reporting ``lease`` (it stopped)."""
    if _metrics is not None and lease in _metrics.leases:
        _metrics.leases.remove(lease)


def share_with_pool() -> None:
    """Let this process's pool processes count into its metrics (call it before the
    pool starts, in the process that serves them). Idempotent."""
    global _pool, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool, _pool_pid = SharedCounters.create(), os.getpid()


def count(name: str, election: str, amount: int = 1) -> None:
    """Add ``amount`` to counter ``name`` (a key of :data:`COUNTERS`); no-op before ``serve``,
    unless this is a pool process of a worker that shares its metrics."""
    if not amount:
        return
    if _metrics is not None and _metrics_pid == os.getpid():
        _metrics.add(name, election, amount)
        return
    pool = _pool_here()
    if pool is not None:
        pool.add(name, election, amount)


def adjust(name: str, election: str, amount: int) -> None:
    """Move gauge ``name`` (a key of :data:`GAUGES`) by ``amount``; as :func:`count`."""
    count(name, election, amount)


def _pool_here() -> SharedCounters | None:
    """This process's own mapping of the shared counter file (opened once per process)."""
    global _pool, _pool_pid
    pid = os.getpid()
    if _pool_pid != pid:
        with _lock:
            if _pool_pid != pid:
                _pool, _pool_pid = SharedCounters.from_env(), pid
    return _pool
