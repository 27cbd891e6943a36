"""A command on one host only: ``leader run`` on Redis, PostgreSQL and etcd against single-beat.

Three runners per system wrap :mod:`harness.singleton_child`, which appends its
``pid epoch start now`` to one file every 50 ms. Faults, applied in turn to the
runner whose child is running (20 by default):

* ``sigkill``: SIGKILL to the runner process alone (the child is not signalled:
  what an OOM kill or ``kill -9 <pid>`` does);
* ``sigstop``: SIGSTOP to the runner until another child started (at most
  3 ttl + 5 s), then SIGCONT;
* ``cut``: the runner's store proxies hold all traffic for as long.

Reported per system: pairs of children that ran at once (overlap), how long the
old child lived on after the fault, when the new child started, the gap between
them, and the children still alive after every runner got SIGTERM (orphans).

    .venv/bin/python benchmarks/singleton.py [--faults N] [SYSTEM ...]

SYSTEM is one of ``leader-redis``, ``leader-postgres``, ``leader-etcd``,
``single-beat``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make ``harness`` importable

from harness.etcd import EtcdCluster  # noqa: E402
from harness.proxy import TcpProxy  # noqa: E402
from harness.servers import PostgresServer, RedisServer  # noqa: E402
from harness.singleton import FAULTS, Fleet, Outcome, lifetimes, overlaps, summary  # noqa: E402

#: Lease ttl of every system (``SINGLE_BEAT_LOCK_TIME`` is whole seconds and must
#: exceed twice its 1 s heartbeat).
TTL = 3.0
#: ``leader run --grace``: within the bound ttl 3 s leaves (0.73 s).
GRACE = 0.5

SYSTEMS = ("leader-redis", "leader-postgres", "leader-etcd", "single-beat")


@dataclass
class Result:
    system: str
    outcomes: list[Outcome]
    overlaps: int
    orphans: int
    #: Faults after which no single child ran steadily within 30 s (the fleet was
    #: then killed and started afresh).
    unsettled: int
    seconds: float


def _store(system: str) -> tuple[list[int], Callable[[list[TcpProxy]], str], Callable[[], None]]:
    """Ports, URL builder and closer of a fresh store for ``system``."""
    if system == "leader-etcd":
        cluster = EtcdCluster()
        cluster.start()
        ports = [member.port for member in cluster.members]
        return (
            ports,
            lambda proxies: "etcd://" + ",".join(f"127.0.0.1:{p.port}" for p in proxies),
            cluster.close,
        )
    if system == "leader-postgres":
        pg = PostgresServer()
        pg.start()
        pg.reset()
        return [pg.port], lambda proxies: proxies[0].url_for(pg.url), pg.close
    redis = RedisServer()
    redis.start()
    return [redis.port], lambda proxies: proxies[0].url_for(redis.url), redis.close


def run_system(system: str, faults: int, log: Callable[[str], None]) -> Result:
    ports, url_via, close = _store(system)
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-singleton-{system}-"))
    kind = "single-beat" if system == "single-beat" else "leader"
    fleet = Fleet(kind, ports, url_via, workdir, ttl=TTL, grace=GRACE)
    began = time.monotonic()
    outcomes: list[Outcome] = []
    unsettled = 0
    try:
        fleet.top_up()
        for i in range(faults):
            try:
                fleet.steady()
            except AssertionError:
                log(f"  {system}: no single child runs steadily; starting afresh")
                unsettled += 1
                fleet.reset()
            outcome = fleet.fault(FAULTS[i % len(FAULTS)])
            log(f"  {system} {outcome}")
            outcomes.append(outcome)
        fleet.stop()
        time.sleep(1.0)  # what outlives its runner by a second has been orphaned
        orphans = len(fleet.orphans())
    finally:
        fleet.close()
        close()
    return Result(
        system,
        outcomes,
        len(overlaps(lifetimes(fleet.records))),
        orphans,
        unsettled,
        time.monotonic() - began,
    )


def table(results: list[Result]) -> str:
    """One Markdown table, a system per column."""
    rows: dict[str, list[str]] = {
        "faults": [str(len(r.outcomes)) for r in results],
        "overlapping children": [str(r.overlaps) for r in results],
        "orphans at the end": [str(r.orphans) for r in results],
        "faults after which no single child settled": [str(r.unsettled) for r in results],
    }
    for fault in FAULTS:
        chosen = [[o for o in r.outcomes if o.fault == fault] for r in results]
        for measure in summary([]):
            rows[f"{fault}: {measure}"] = [summary(c)[measure] for c in chosen]
    lines = ["| | " + " | ".join(r.system for r in results) + " |"]
    lines.append("|---" * (len(results) + 1) + "|")
    lines += [f"| {name} | " + " | ".join(values) + " |" for name, values in rows.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=20, help="faults per system (default 20)")
    parser.add_argument("systems", nargs="*", metavar="SYSTEM")
    args = parser.parse_args(argv)
    unknown = [name for name in args.systems if name not in SYSTEMS]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    results = []
    for system in args.systems or SYSTEMS:
        results.append(run_system(system, args.faults, lambda line: print(line, flush=True)))
    print(f"\nttl {TTL:g} s, grace {GRACE:g} s; median / max\n\n{table(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
