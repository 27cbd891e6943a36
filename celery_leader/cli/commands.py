"""What ``leader status``, ``resign``, ``check``, ``plan`` and ``run`` do, for both command
lines. Each prints through ``echo`` and returns the exit code, or raises :class:`OpsError`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone, tzinfo
from typing import Any

from ..backends import HolderInfo, LeaseLock, StoreFacets, open_store
from ..clock import StoreClock
from ..election.lease_set import lease_set
from ..exceptions import ConfigError, MissingExtra, StoreUnavailable
from ..ledger.summary import EntryRuns, summarize
from ..probes import health
from ..run.runner import Runner
from ..run.spec import run_spec
from ..schedule import plan as planning
from ..schedule.jobs import Job
from ..settings.config import LeaderConfig, validate_name

#: Exit codes of ``status`` (documented in docs/cli.md): someone leads ...
EXIT_LEADER = 0
#: ... a command failed (``resign``, ``check``) ...
EXIT_FAILED = 1
#: ... the store could not be asked, or the settings or arguments are bad ...
EXIT_UNKNOWN = 2
#: ... nobody leads.
EXIT_NO_LEADER = 3

Echo = Callable[[str], None]


class OpsError(Exception):
    """A command failed: ``str(self)`` is the line to print, ``code`` the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _unreachable(config: LeaderConfig, exc: Exception) -> OpsError:
    return OpsError(f"store {config.display_url} unreachable: {exc}", EXIT_UNKNOWN)


def _open(config: LeaderConfig, elections: Sequence[str]) -> StoreFacets:
    """``config``'s store, once every name in ``elections`` is valid."""
    try:
        for name in elections:
            validate_name("election", name)
        return open_store(config)
    except ConfigError as exc:
        raise OpsError(str(exc), EXIT_UNKNOWN) from exc


def _row(election: str, info: HolderInfo | None) -> dict[str, Any]:
    return {
        "election": election,
        "holder": None if info is None else info.instance_id,
        "epoch": None if info is None else info.epoch,
        "ttl_remaining": None if info is None else info.ttl_remaining,
        "since": None if info is None else info.since,
    }


def _utc(at: float | None, suffix: str = "") -> str:
    """A time for a table: UTC to the second, ``-`` when unknown."""
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S") + suffix


def status(
    config: LeaderConfig, echo: Echo, elections: Sequence[str] = (), as_json: bool = False
) -> int:
    """Print holder, epoch, time left and term start of each election; return the exit code.

    Without ``elections``: every election the store knows plus the configured
    beat and worker elections, and 0 when at least one of them has a leader.
    With ``elections``: just those, and 0 only when every one has a leader.
    Otherwise 3 (nobody leads); 2 when the store cannot be asked.
    """
    store = _open(config, elections)
    try:
        holders = store.lock.holders(list(elections) or None)
        configured = {config.beat_election, config.worker_election}
        names = list(elections) or sorted(holders.keys() | configured)
        if missing := [name for name in names if name not in holders]:
            holders.update(store.lock.holders(missing))
        rows = [_row(name, holders[name]) for name in names]
        clock = _clock(config, store.lock, names[0])
        summaries = store.runs.summaries(config.beat_election) if config.ledger else None
        runs = None if summaries is None else summarize(summaries, time.time())
    except (StoreUnavailable, ConfigError) as exc:
        raise _unreachable(config, exc) from exc
    finally:
        store.close()
    led = [row["holder"] is not None for row in rows]
    code = EXIT_LEADER if (all(led) if elections else any(led)) else EXIT_NO_LEADER
    if as_json:
        ledger = {} if runs is None else {"entries": [r.to_json() for r in runs]}
        shown = {"store": config.display_url, "elections": rows, **clock, **ledger}
        echo(json.dumps(shown, indent=2))
        return code
    width = max([len(row["election"]) for row in rows] + [19])
    holder_width = max([len(row["holder"] or "") for row in rows] + [31])
    line = f"{{:<{width}}} {{:<{holder_width}}} {{:>13}} {{:>9}}  {{}}".format
    echo(f"store: {config.display_url}")
    echo(line("ELECTION", "HOLDER", "EPOCH", "TTL LEFT", "SINCE (UTC)"))
    for row in rows:
        ttl = row["ttl_remaining"]
        left = "-" if ttl is None else f"{ttl:.1f}s"
        if row["holder"] is not None and ttl is None:
            left = "held"  # a store that frees the lock only when the holder ends
        epoch = "-" if row["epoch"] is None else str(row["epoch"])
        holder, since = row["holder"] or "(nobody)", _utc(row["since"], "Z")
        echo(line(row["election"], holder, epoch, left, since))
    offset = clock["clock_offset"]
    if offset is not None:
        echo(
            f"clock: this host's is {-offset:+.3f} s off the store's "
            f"(within {clock['clock_error']:.3f} s; leader_clock {config.clock!r})"
        )
    if clock["clock_problem"] is not None:
        echo(f"this host does not lead: {clock['clock_problem']}")
    if runs is not None:
        _echo_runs(runs, echo)
    return code


def _echo_runs(runs: list[EntryRuns], echo: Echo) -> None:
    """The run ledger's table: one line per entry."""
    echo("run ledger, the last slot of each entry:" if runs else "run ledger: no runs recorded")
    if not runs:
        return
    width = max([len(r.last_slot) for r in runs] + [9])
    line = f"{{:<{width}}} {{:<9}} {{:<8}} {{:<19}} {{:>9}} {{:>5}} {{:>6}} {{:>7}}".format
    echo(line("LAST SLOT", "STATE", "OUTCOME", "STARTED", "DURATION", "RUNS", "FAILED", "SKIPPED"))
    for r in runs:
        duration = "-" if r.duration is None else f"{r.duration:.1f}s"
        outcome, started = r.outcome or "-", _utc(r.started)
        echo(line(r.last_slot, r.state, outcome, started, duration, r.runs, r.failures, r.skips))


def _clock(config: LeaderConfig, lock: LeaseLock, election: str) -> dict[str, Any]:
    """This host's clock against the store's (one round trip): ``clock_offset`` (the
    store's minus this host's; ``None`` for a store without a clock), its
    ``clock_error``, and ``clock_problem``: why this host does not lead, if so."""
    measured = StoreClock()
    sent = measured.monotonic()
    now = lock.store_time(election)
    if now is not None and lock.clock_resolution is not None:
        measured.sample(now, sent, measured.monotonic(), lock.clock_resolution)
    offset, error = measured.offset, measured.error
    problem = None
    if config.clock == "local" and offset is not None and error is not None:
        if abs(offset) - error > config.max_clock_skew:
            problem = (
                f"its clock is {-offset:+.1f} s off the store's, more than leader_max_clock_skew "
                f'({config.max_clock_skew:g} s), and leader_clock is "local"'
            )
    return {"clock_offset": offset, "clock_error": error, "clock_problem": problem}


def resign(config: LeaderConfig, echo: Echo, election: str | None, wait: bool = True) -> int:
    """Ask the holder of ``election`` (default: the beat election) to hand over; with
    ``wait``, also wait for the next holder (up to ``2 x renew interval + ttl``)."""
    name = election or config.beat_election
    store = _open(config, [name])
    try:
        info = store.lock.request_resign(name)
        if info is None:
            raise OpsError(f"nobody leads {name!r}; nothing to resign", EXIT_FAILED)
        echo(f"asked {info.instance_id} (epoch {info.epoch}) to hand over {name!r}")
        if not wait:
            return EXIT_LEADER
        # The holder acts at its next renewal; a follower then needs up to one
        # more renew interval (plus the ttl if a release goes unannounced).
        patience = 2 * config.renew_interval + config.ttl
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            now = store.lock.holder(name)
            if now is not None and now.epoch > info.epoch:
                echo(f"{now.instance_id} leads {name!r} now (epoch {now.epoch})")
                return EXIT_LEADER
            time.sleep(0.05)
        raise OpsError(f"no new holder of {name!r} within {patience:g} s", EXIT_FAILED)
    except (StoreUnavailable, ConfigError) as exc:
        raise _unreachable(config, exc) from exc
    finally:
        store.close()


def check(path: str | None, echo: Echo, max_age: float | None = None) -> int:
    """Read the health file at ``path``; print one line; 0 when healthy, else 1."""
    if not path:
        echo("UNHEALTHY: no health file: set leader_health_file (or pass --file)")
        return EXIT_FAILED
    healthy, line = health.check(path, max_age)
    echo(line)
    return EXIT_LEADER if healthy else EXIT_FAILED


def plan(
    config: LeaderConfig,
    echo: Echo,
    jobs: Sequence[Job],
    window: tuple[str, str],
    zone: tzinfo,
    stored: bool = False,
    as_json: bool = False,
) -> int:
    """Print the slots ``jobs`` would send between ``window``'s two times; return 0.

    Bad input, and an unreachable store (``stored``), raise :class:`OpsError` with code 2.
    """
    try:
        now = datetime.now(timezone.utc)
        start, end = (planning.parse_moment(text, zone, now) for text in window)
        if end < start:
            raise OpsError(
                f"--to ({end.isoformat()}) is before --from ({start.isoformat()})", EXIT_UNKNOWN
            )
        last_runs = planning.stored_last_runs(_beat_state(config), jobs) if stored else None
        result = planning.plan(jobs, start, end, last_runs)
    except (planning.PlanError, ConfigError) as exc:
        raise OpsError(str(exc), EXIT_UNKNOWN) from exc
    except StoreUnavailable as exc:
        raise _unreachable(config, exc) from exc
    if as_json:
        echo(json.dumps(planning.to_json(result, zone), indent=2))
    else:
        for line in planning.to_lines(result, zone):
            echo(line)
    return 0


def _beat_state(config: LeaderConfig) -> dict[str, str]:
    """The beat election's stored state, in one round trip on a connection of its own."""
    with contextlib.closing(open_store(config)) as store:
        return store.records.load(config.beat_election)


def run(
    config: LeaderConfig,
    election: str,
    command: Sequence[str],
    grace: float | None = None,
    restart: str = "never",
) -> int:
    """Run ``command`` while this process leads ``election``; return the exit status.

    Bad arguments, and a store whose client is not installed, raise
    :class:`OpsError` with code 2 before anything campaigns.
    """
    try:
        spec = run_spec(config, election, command, grace, restart)
        # A store whose client is missing fails here, not later in the lease thread.
        _ = lease_set(config).store
        runner = Runner(config, spec)
    except (ConfigError, MissingExtra) as exc:
        raise OpsError(str(exc), EXIT_UNKNOWN) from exc
    try:
        return runner.run()
    except ConfigError as exc:  # the health port is taken
        raise OpsError(str(exc), EXIT_UNKNOWN) from exc
