"""Every benchmark in one command; prints one Markdown report.

    .venv/bin/python benchmarks/run.py [--quick] [--reps N] [--publish]

Writes ``benchmarks/results/latest.md`` and ``benchmarks/results/failover.png``;
with ``--publish`` also ``docs/benchmarks.md`` and ``docs/img/failover.png``.
Everything runs on loopback: real redis-server and PostgreSQL processes, real
``celery beat`` processes. Every process started is killed before it exits.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make ``benchmarks`` and ``tests`` importable

from benchmarks import beat_load, crash_gap, failover, store_load  # noqa: E402
from harness.groups import kill_all  # noqa: E402
from harness.servers import PG_BIN  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
#: The scale, django rows and start-up benchmarks' results (runs of many minutes,
#: so not part of this command), kept for the page: ``python -m benchmarks.scale``
#: (and ``django_rows``, ``start``), and paste their output there.
SCALE_RESULTS = ROOT / "benchmarks" / "scale_results.md"
#: Bursts on each lease store, before and after a change (``benchmarks/burst.py`` run
#: by hand, as the page says), as the page shows them.
BURST_RESULTS = ROOT / "benchmarks" / "burst_results.md"
#: The run ledger at volume (``benchmarks/ledger_volume.py``, run on its own: it
#: seeds a million records on each store), as the page shows it.
LEDGER_RESULTS = ROOT / "benchmarks" / "ledger_volume_results.md"
#: The console at volume (``python -m benchmarks.console``, run on its own: it
#: seeds 100,000 entries and a million run records), as the page shows it.
CONSOLE_RESULTS = ROOT / "benchmarks" / "console_results.md"
DOCS = ROOT / "docs"
COMMAND = ".venv/bin/python benchmarks/run.py"

#: Benchmarks written as scripts of their own: module, extra arguments for --quick.
EXTERNAL = (
    ("3. `@leader_only` cost", "bench_leader_only", ()),
    ("4. Dispatch rate, 10,000 entries due at once", "bench_dispatch", ("--rounds", "1")),
    ("4a. Waiting for the store's replicas: one claim batch", "bench_replica_acks",
     ("--batches", "30")),
    ("4b. Publisher confirms on RabbitMQ: one beat publish", "publish_confirms",
     ("--count", "300")),
    ("4c. Run ledger: worker-side cost per beat-sent message", "bench_ledger",
     ("--messages", "300")),
)
EXTERNAL_TIMEOUT = 300
#: A burst on each lease store against a bare send_task loop, the same in --quick
#: (about 40 s); 100,000 entries: ``python -m benchmarks.burst --stores redis,postgres``.
BURST = (
    "4d. Bursts: 10,000 entries due in the same second, Redis and PostgreSQL lease stores",
    "burst",
    ("--n", "10000", "--rounds", "3", "--stores", "redis,postgres"),
)
#: The Dramatiq schedulers, after the store load: title, module, extra arguments for --quick.
DRAMATIQ = ("7. Dramatiq schedulers, three replicas", "bench_dramatiq", ("--reps", "1"))
#: The scale benchmark at its smallest N only, quick or not (about 2 min); larger N
#: take an hour: ``python -m benchmarks.scale``, in the page's own section.
SCALE = (
    "9. Scale: 1,000 hourly entries and one every second",
    "scale",
    ("--n", "1000", "--store-n", "0", "--only", "leader,redbeat", "--seconds", "15"),
)

#: What the issue measured for redbeat and single-beat with ttl 3 s: the numbers to beat.
GOALS = {"redbeat": {"graceful": 0.8, "sigkill": 3.6}, "single-beat": {"graceful": 4.0}}
GOAL_PARTITION_DUPS = 75


_START = time.monotonic()


def log(line: str) -> None:
    elapsed = int(time.monotonic() - _START)
    print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {line}", file=sys.stderr, flush=True)


def run_external(module: str, extra: tuple[str, ...]) -> str:
    """The Markdown a benchmark script prints (run with arguments ``extra``), or one
    line saying why there is none."""
    if not (ROOT / "benchmarks" / f"{module}.py").exists():
        line = f"_Skipped: benchmarks/{module}.py does not exist yet._"
        log(f"  {line}")
        return line
    argv = [sys.executable, "-m", f"benchmarks.{module}", *extra]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its servers and children die with its group on timeout
    )
    try:
        out, _ = proc.communicate(timeout=EXTERNAL_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"_Failed: benchmarks/{module}.py took more than {EXTERNAL_TIMEOUT} s._"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it left behind
        except ProcessLookupError:
            pass
    if proc.returncode != 0:
        return f"_Failed: benchmarks/{module}.py exited with {proc.returncode}._\n\n{out.strip()}"
    return out.strip()


def _median(result: failover.SystemResult | None, fault: str) -> float | None:
    trials = result.of(fault) if result is not None else []
    return statistics.median(t.gap for t in trials) if trials else None


def claims_table(results: list[failover.SystemResult]) -> str:
    """The guarantees page's liveness and safety claims against the worst run of each.

    A publish happens only when the entry is due, so a gap may exceed the
    hand-over itself by up to one period. After a store restart the claim
    counts from the moment the store answers again.
    """
    ttl, slack, renew = failover.TTL, failover.PERIOD, failover.TTL / 3
    by_key = {r.system.key: r for r in results}
    bounds = {
        "leader-redis": {
            "graceful": 0.5,
            "sigkill": 0.5,
            "sigstop": ttl + 0.5,
            "partition": ttl + 0.5,
            "store-restart": renew + 0.5,
        },
        "leader-postgres": {
            "graceful": 0.5,
            "sigkill": 0.5,
            "sigstop": ttl + 0.5,
            "partition": ttl + 0.5,
            "store-restart": renew + 0.5,
        },
        # wait_timeout counts whole seconds: a paused or cut-off holder's session
        # ends ceil(ttl) after its last statement.
        "leader-mysql": {
            "graceful": 0.5,
            "sigkill": 0.5,
            "sigstop": math.ceil(ttl) + 0.5,
            "partition": math.ceil(ttl) + 0.5,
            "store-restart": renew + 0.5,
        },
        "leader-etcd": {
            "graceful": 0.5,
            # etcd frees an expired lease up to 0.5 s after its ttl (its expiry
            # loop runs every 0.5 s), then the take-over's 0.5 s as elsewhere.
            "sigkill": ttl + 1.0,
            "sigstop": ttl + 1.0,
            "partition": ttl + 1.0,
            # All members restarted: the new Raft leader gives every lease its TTL
            # again plus one election timeout (1 s); the holder usually renews first.
            "store-restart": ttl + 1.5,
        },
        "leader-file": {"graceful": 0.5, "sigkill": 0.5},
    }
    lines = [
        f"| celery-leader claim (guarantees page) | bound + one period ({slack:g} s) "
        "| worst run | slots sent twice | holds |",
        "|---|---|---|---|---|",
    ]
    for key, faults in bounds.items():
        result = by_key.get(key)
        for fault, bound in faults.items():
            trials = result.of(fault) if result is not None else []
            if result is None or not trials:
                continue
            if fault == "store-restart":
                waits = [None if t.censored else t.recovered - t.fault_end for t in trials]
            else:
                waits = [None if t.censored else t.gap for t in trials]
            worst = None if None in waits else max(waits)
            dups = sum(t.dups for t in trials)
            ok = worst is not None and worst <= bound + slack and dups == 0
            lines.append(
                f"| {result.system.label}: {failover.FAULT_LABELS[fault]} | {bound + slack:.2f} s "
                f"| {'none' if worst is None else f'{worst:.2f} s'} | {dups} "
                f"| {'yes' if ok else '**no**'} |"
            )
    return "\n".join(lines)


def _trials(results: list[failover.SystemResult], faults: tuple[str, ...]) -> list[failover.Trial]:
    return [t for r in results for t in r.trials if t.fault in faults]


def _alive(trials: list[failover.Trial]) -> str:
    return f"{sum(t.alive for t in trials)}/{sum(t.expected_alive for t in trials)} alive"


def goals_table(results: list[failover.SystemResult]) -> str:
    """The issue's targets, measured there for redbeat and single-beat with ttl 3 s."""
    by_key = {r.system.key: r for r in results}
    ours = [r for r in results if r.system.kind == "leader" and r.trials]
    lines = [
        "| goal | others, this run | celery-leader, this run | met |",
        "|---|---|---|---|",
    ]
    for key, goals in GOALS.items():
        for fault, target in goals.items():
            theirs = _median(by_key.get(key), fault)
            mine = [(m, r.system.label) for r in ours if (m := _median(r, fault)) is not None]
            if not mine:
                continue
            slowest, label = max(mine)
            met = slowest < target and (theirs is None or slowest < theirs)
            lines.append(
                f"| faster {failover.FAULT_LABELS[fault]} hand-over than {key}'s {target:g} s "
                f"| {key}: {'not run' if theirs is None else f'{theirs:.2f} s'} "
                f"| slowest: {label}, {slowest:.2f} s | {'yes' if met else '**no**'} |"
            )
    partition = _trials(ours, ("partition",))
    single = _trials([r for r in results if r.system.kind == "single-beat"], ("partition",))
    if partition:
        mine_dups = sum(t.dups for t in partition)
        lines.append(
            f"| fewer duplicates than single-beat's {GOAL_PARTITION_DUPS} in a "
            f"{failover.PARTITION:g} s partition "
            f"| single-beat: {sum(t.dups for t in single)} in {len(single)} runs "
            f"| {mine_dups} in {len(partition)} runs | {'yes' if mine_dups == 0 else '**no**'} |"
        )
    lost = ("sigstop", "partition", "store-restart")
    mine_lost = _trials(ours, lost)
    if mine_lost:
        redbeat = _trials([r for r in results if r.system.kind == "redbeat"], lost)
        kept = all(t.alive == t.expected_alive for t in mine_lost)
        lines.append(
            "| no beat dies after a lost lock or a store restart (all of redbeat's do) "
            f"| redbeat: {_alive(redbeat)} | {_alive(mine_lost)} | {'yes' if kept else '**no**'} |"
        )
    return "\n".join(lines)


def summary(results: list[failover.SystemResult]) -> str:
    """Ratios rather than seconds: they carry over from this noisy machine to others."""
    by_key = {r.system.key: r for r in results}
    out = []
    for fault in ("graceful", "sigkill"):
        ours = {
            k: _median(by_key.get(k), fault)
            for k in ("leader-redis", "leader-postgres", "leader-mysql", "leader-file")
        }
        others = {k: _median(by_key.get(k), fault) for k in ("redbeat", "single-beat")}
        parts = []
        for key, mine in ours.items():
            if mine is None:
                continue
            ratios = [
                f"{by_key[other].system.label} {theirs / mine:.1f}x that"
                for other, theirs in others.items()
                if theirs is not None
            ]
            parts.append(f"{by_key[key].system.label} {mine:.2f} s ({', '.join(ratios)})")
        if parts:
            out.append(f"* {failover.FAULT_LABELS[fault]}, median gap: " + "; ".join(parts) + ".")
    for result in results:
        if result.trials:
            dups = sum(t.dups for t in result.trials)
            orphans = sum(t.orphans for t in result.trials)
            extra = f", {orphans} orphaned beat(s) left publishing" if orphans else ""
            if result.stray_dups:
                extra += f", {result.stray_dups} more while the cluster started"
            out.append(
                f"* {result.system.label}: {dups} duplicate publishes in {len(result.trials)} "
                f"faults{extra}."
            )
    return "\n".join(out)


def environment() -> str:
    redis_version = (
        subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False)
        .stdout.split()[2]
        .removeprefix("v=")
    )
    pg_version = subprocess.run(
        [str(PG_BIN / "postgres"), "--version"], capture_output=True, text=True, check=False
    ).stdout.split()[2]
    etcd_version = subprocess.run(
        ["etcd", "--version"], capture_output=True, text=True, check=False
    ).stdout.split()[2]
    mariadb_version = subprocess.run(
        ["/usr/sbin/mariadbd", "--version"], capture_output=True, text=True, check=False
    ).stdout.split()[2].split("-")[0]
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}"
        for name in ("celery", "redis", "etcd3gw", "pymysql", "celery-redbeat", "single-beat")
        if _installed(name)
    )
    return (
        f"{datetime.date.today().isoformat()}; {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f} at start; Python {platform.python_version()}, "
        f"{versions}; redis-server {redis_version}, PostgreSQL {pg_version}, "
        f"MariaDB {mariadb_version}, etcd {etcd_version}"
    )


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def report(args: argparse.Namespace, image: str) -> str:
    started = time.monotonic()
    env = environment()
    sections = []
    log("1-2. hand-over, duplicates and survivors")
    results = failover.run(args.reps, args.quick, log)
    failover.plot(results, RESULTS / "failover.png")
    runs = "1 run" if args.reps == 1 else f"median / max of {args.reps} runs"
    if any(r.of("store-restart") for r in results):
        runs += "; store restart: 1 run"
    sections.append(
        f"## 1. Hand-over gap, seconds ({runs})\n\n"
        "The longest silence between two publishes around the fault, as the broker saw "
        f"them; the entry is due every {failover.PERIOD:g} s, so that is the floor. "
        "`>`: nothing was published again before the benchmark gave up.\n\n"
        f"{failover.handover_table(results)}\n\n![One fail-over per system]({image})"
    )
    sections.append(
        "## 2. Duplicates and survivors (sum over the runs)\n\n"
        "Slots sent twice, and beat replicas still running at the end of the fault "
        "(out of those that should be: the stopped or killed leader is not counted).\n\n"
        f"{failover.safety_table(results)}\n\n{summary(results)}\n\n"
        f"### Goals\n\n{goals_table(results)}\n\n"
        f"### celery-leader's own claims\n\n{claims_table(results)}"
    )
    for title, module, quick_args in EXTERNAL:
        log(title)
        extra = quick_args if args.quick else ()
        sections.append(f"## {title}\n\n{run_external(module, extra)}")
    log(BURST[0])
    sections.append(f"## {BURST[0]}\n\n{run_external(BURST[1], BURST[2])}")
    log("5. store load")
    loads = store_load.run(args.quick, log)
    sections.append(
        f"## 5. Store load: {store_load.HOLDERS} lease holders, {store_load.ELECTIONS} "
        f"elections, ttl {store_load.TTL:g} s\n\n{store_load.table(loads)}"
    )
    load_minutes = 1 if args.quick else 10
    log(f"6. beat store load ({load_minutes} min)")
    rows = beat_load.run(load_minutes, 200, 3, log)
    sections.append(
        f"## 6. Beat store load over {load_minutes} min: 3 beats, 200 entries every "
        f"{beat_load.EVERY:g} s\n\n{beat_load.table(rows, 200, 3)}"
    )
    log(DRAMATIQ[0])
    extra = DRAMATIQ[2] if args.quick else ()
    sections.append(f"## {DRAMATIQ[0]}\n\n{run_external(DRAMATIQ[1], extra)}")
    log("8. crash hand-over on Redis, ttl 3 s and 15 s")
    crashes = crash_gap.run(1 if args.quick else crash_gap.REPS, log)
    sections.append(
        "## 8. Crash hand-over on Redis, ttl 3 s and 15 s\n\n"
        "SIGKILL of the sending replica's process group; the longest silence at the "
        "broker. celery-leader replaces a holder whose connection closed without waiting "
        "for the ttl; the others wait out their lock.\n\n"
        f"{crash_gap.table(crashes)}\n\n"
        "Store round trips per holder per second meanwhile (section 5): "
        f"{store_load.per_holder(loads)}."
    )
    log(SCALE[0])
    sections.append(f"## {SCALE[0]}\n\n{run_external(SCALE[1], SCALE[2])}")
    minutes = (time.monotonic() - started) / 60
    head = (
        f"_`{COMMAND}{' --quick' if args.quick else ''}` on {env}; "
        f"ttl {failover.TTL} s everywhere; took {minutes:.1f} min._"
    )
    return head + "\n\n" + "\n\n".join(sections) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 run, fewer faults (~4 min)")
    parser.add_argument("--reps", type=int, help="runs of each fault (default 5; --quick: 1)")
    parser.add_argument(
        "--publish", action="store_true", help="also write docs/benchmarks.md and its plot"
    )
    args = parser.parse_args()
    args.reps = args.reps or (1 if args.quick else 5)
    # SIGTERM unwinds like Ctrl-C, so the servers and beats below are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    RESULTS.mkdir(parents=True, exist_ok=True)
    try:
        body = report(args, "failover.png")
    finally:
        kill_all()
    (RESULTS / "latest.md").write_text("# Benchmark results\n\n" + body)
    print(body)
    if args.publish:
        (DOCS / "img").mkdir(exist_ok=True)
        shutil.copyfile(RESULTS / "failover.png", DOCS / "img" / "failover.png")
        page = PAGE.format(
            command=COMMAND,
            pause=failover.PAUSE,
            partition=failover.PARTITION,
            scale_results=SCALE_RESULTS.read_text(),
            burst_results=BURST_RESULTS.read_text(),
            ledger_results=LEDGER_RESULTS.read_text(),
            console_results=CONSOLE_RESULTS.read_text(),
            # One heading level down: the results sit under the page's own sections.
            results=re.sub(r"(?m)^(#{2,}) ", r"#\1 ", body).replace(
                "(failover.png)", "(img/failover.png)"
            ),
        )
        (DOCS / "benchmarks.md").write_text(page)
        log("wrote docs/benchmarks.md and docs/img/failover.png")
    return 0


PAGE = """# Benchmarks

One command runs them all, on one machine, with real servers and real processes
on loopback (no Docker):

```bash
{command}            # ~25 min; --quick: ~4 min, 1 run, fewer faults
{command} --publish  # also rewrites this page and its plot
```

It prints the Markdown below and writes it to `benchmarks/results/latest.md`.
Read the numbers as ratios: the machine is shared and noisy, so absolute
seconds move from run to run; who is faster by how much does not.

## How the fail-over benchmark works

* **Systems**, all with a 3 s lock: celery-leader's `LeaderScheduler` on Redis,
  PostgreSQL and a file lock (`leader_ttl = 3`, renewing every 1 s);
  celery-redbeat (`redbeat_lock_timeout = 3`, `beat_max_loop_interval = 1`,
  so standbys retry the lock every second); single-beat wrapping the stock
  `celery beat` (`SINGLE_BEAT_LOCK_TIME=3`, `SINGLE_BEAT_HEARTBEAT_INTERVAL=1`,
  the smallest it accepts). The app is `benchmarks/apps/bench_app.py`.
* **Three replicas per system**, each a real `celery beat` process (or
  `single-beat celery beat`), with one entry due every 0.1 s. A dead replica
  is replaced before the next fault, as an orchestrator would; its whole
  process group is killed first.
* **Gaps are measured at the broker**: a thread pops every message off the
  Redis queue and stamps it; Celery's `origin` header names the publishing
  process. The gap is the longest interval between consecutive publishes from
  just before the fault until the hand-over has settled.
* **Faults**, applied to whichever replica is publishing: `SIGTERM` to the main
  process (what `docker stop` does); `SIGKILL` to its process group; `SIGSTOP`
  for {pause:g} s (past the ttl) then `SIGCONT`; a partition, where the replica's
  own TCP proxy to the lock store holds all traffic for {partition:g} s while the
  broker stays reachable (the split in which a stale leader can keep
  publishing); and a restart of the lock store itself (once per system; Redis
  runs without persistence, so it comes back empty). A file lock has no network
  to cut and no server to restart.
* **Duplicates**: celery-leader stamps each message with its slot
  (`leader_slot`, entry + due time); a slot seen twice is a duplicate. For
  redbeat the benchmark's scheduler subclass stamps the entry and the
  `last_run_at` it was due after, read from redbeat's shared schedule, which
  is the same thing. single-beat's beats share no schedule, so its
  duplicates are counted per period: ordered by send time, a publish less than
  half a period after the previous one is a second copy of that period's run
  (one beat never sends that fast; two beats do it once per period). Counted
  that way, celery-leader and redbeat show no duplicates either.
* **Survivors**: beat replicas still running when the fault has settled.
  An *orphaned beat* is a `celery beat` still running after its single-beat
  wrapper died.

## How the store-load benchmark works

200 leases (one backend, so one set of connections, each: as 200 processes
would have) in 20 elections run in 4 processes against one Redis and one
PostgreSQL, with ttl 3 s. Once every election is led, the store's work is
counted over a window: Redis commands from `INFO commandstats` (which counts
the commands inside each Lua script too; every request of the backend is one
script call, a round trip); PostgreSQL
statements from `pg_stat_statements`, plus the failed ones from the server log
(a queued follower's lock wait ends with `lock_timeout` once per ttl and starts
again). Server CPU is Redis' `used_cpu_user + used_cpu_sys`, or the CPU of
every PostgreSQL process. Then every holder process is killed at once and a
new fleet started, and the time until all 20 elections have a leader from the
new fleet is measured from the kill (and likewise after SIGTERM, when every
holder releases first). On Redis, one follower per election checks the
holder's presence every 0.15 s whatever the ttl (6.7 round trips a second per
election); the rest scales with `1 / leader_ttl`.

## How the beat store-load benchmark works

Three real `celery beat` replicas (`tests/apps/beat_app.py`, ttl 3 s) share a
lease store (a redis-server of its own) and dispatch 200 interval entries due
every second, for 10 minutes (`--quick`: 1). Per minute it reports what the
lease store's Redis did: commands per second (`INFO commandstats`, which counts
the commands inside each Lua script: a claim of 200 entries is about 400),
claim scripts per second (the claim script is the only caller of `TYPE`), the
messages that reached the broker (a second redis-server, emptied every
second), and the broker's connected clients. It also runs on its own:
`.venv/bin/python -m benchmarks.beat_load [--minutes 10]`. Issue 14 saw the
commands per second climb from 531 to 881 in 5 minutes, with about 84 claim
scripts a second, because interval entries drifted apart; flat means the last
minute within 10 % of the first, at about one claim script per due batch.

## How the scale benchmark works

`.venv/bin/python -m benchmarks.scale` runs, for each N, a leader and a
standby `celery beat` (`benchmarks/apps/scale_app.py`; ttl, and redbeat's lock
timeout, 5 s) with N hourly entries plus one entry due every second, on
servers of their own:

* celery-leader's `LeaderScheduler` on Redis with the N entries in
  `beat_schedule` (code entries), and again with them kept in the store
  (store entries, also at `--store-n`, default 1,000,000), put there before
  the start in batches of 5,000 adds, one round trip each;
* celery-redbeat with the same `beat_schedule`, which it writes into its
  Redis when it starts (`beat_max_loop_interval = 1`, so its standby retries
  the lock every second);
* django-celery-beat's `DatabaseScheduler` on PostgreSQL with N rows. It has
  no lock, so it runs alone and has no hand-over.

The hourly entries fall due half an hour after the start, outside the run:
what is measured is the cost of carrying them. A thread pops every message
off the broker and stamps its arrival. A run starts the leader, then the
standby, waits until the standby idles, measures a window (`--seconds`,
default 30), then stops the leader with SIGTERM, starts a new standby, and
kills the new leader's process group with SIGKILL. A run that takes longer
than `--cap` (default 600 s) stops where it is; its remaining cells show
`—`. The columns:

* **setup**: seconds to put the N entries in the store before the start
  (store entries, django rows).
* **start**: from starting the first replica to its first 1 s message at
  the broker.
* **CPU**: the leader's CPU seconds per second over the window (its process
  group's utime + stime in `/proc`); **RSS**: its resident memory at the end.
* **store ops/s**: Redis commands per second (`INFO stats`); for django,
  PostgreSQL transactions per second (`pg_stat_database`).
* **late p50 / p99**: how long after its due time each 1 s message reached
  the broker; the due time is in its `leader_slot` header (for redbeat and
  django, the benchmark's scheduler subclass stamps the `last_run_at` the run
  was due after: that plus 1 s). **max gap**: the longest interval between
  two arrivals (1 s when nothing is late).
* **SIGTERM**, **SIGKILL**: from the signal to the standby's first 1 s
  message at the broker. The standby sends the next slot when it is due, so
  up to 1 s of this is the schedule, not the hand-over.

Section 9 of the report below runs it at N = 1,000 only, for celery-leader's
code entries and redbeat.

## Reading the results

* **Graceful stop** is a release plus a wake-up for celery-leader on every
  store (Redis pub/sub, a queued `pg_advisory_lock`, a blocked `flock`), so
  the gap is about one schedule period. redbeat releases too, but its standbys
  only look once per `beat_max_loop_interval`; single-beat never releases, so
  its standbys wait out the lock.
* **SIGKILL**: PostgreSQL and the kernel free a dead process's lock at once.
  On Redis, celery-leader's holder keeps a subscription whose connection dies
  with it; one designated follower checks it every 0.15 s and takes the term
  over, so the ttl does not matter (section 8 kills at ttl 3 s and 15 s).
  redbeat and dramatiq-crontab wait out their lock.
* **SIGSTOP and partition**: celery-leader's paused or cut-off leader stops
  believing before its term can pass to anyone, and its slot claims are fenced,
  so nothing is sent twice and it rejoins as a follower. A file lock stays with
  a paused holder (documented: it is safe, not live). redbeat's old leader
  crashes when it finds its lock gone. single-beat's child keeps publishing
  while its wrapper is cut off; the wrapper then dies of the Redis read timeout
  (redis-py 8 times reads out after 5 s by default) without stopping its
  child, which keeps publishing until something kills its process group. After
  a pause, single-beat's two beats publish side by side until a heartbeat
  sorts them out, and sometimes it is the new leader that is terminated: every
  holder counts its fence token from 0, and the check is a GET followed by a
  separate SET.
* **Store restart**: Redis comes back empty. celery-leader re-elects and
  carries on (epochs keep growing); redbeat's schedule was in that Redis, so
  its new leader has nothing to send until a beat restarts.

## Comparing two commits

`benchmarks/compare.py` runs the benchmarks that a change could slow down on two
commits, in one run on one machine, and prints one Markdown table with the
two side by side:

```bash
.venv/bin/python benchmarks/compare.py 0cc6647 int          # ~35 min on an idle machine
.venv/bin/python benchmarks/compare.py 0cc6647 int --quick  # ~6 min: a smoke test only
```

Each commit gets a git worktree of its own, `/tmp/celery-leader-compare/<sha>`
(`--cache DIR`), with a `.venv` made by that commit's `scripts/setup.sh`; the
next run reuses both (`git worktree remove --force DIR` drops one). Every
benchmark runs with the commit's own code and its own copy of the benchmark
script, in rounds of before then after, so that drift in the machine's speed
hits both alike. The rows:

* **hand-over**: graceful stop and SIGKILL of the publishing `celery beat`, per
  store (the fail-over benchmark above, those two faults only, one each a
  round; 5 rounds);
* **store round trips per holder per second**, and the time until all 20
  elections are led again after a SIGKILL of every holder (the store-load
  benchmark; 2 rounds);
* **10,000 entries due at once**: LeaderScheduler's rate over a bare
  `send_task` loop's (`benchmarks/bench_dispatch.py --rounds 1`, 5 rounds back
  to back);
* **idle leader beat with 100,000 code entries**: its CPU seconds per second
  and RSS (`python -m benchmarks.scale --n 100000 --only leader`; 2 rounds),
  and the median idle tick at 100,000 entries on the memory store
  (`benchmarks/tick_cost.py`; 3 rounds);
* **`@leader_only`**: ns per call, in-process and in a forked child, and its
  overhead as a share of one Redis GET (`benchmarks/bench_leader_only.py`; 3
  rounds).

A cell is the median over the rounds, with the lowest and highest in brackets;
the last column is after over before. `--only failover,dispatch` and `--stores
redis,file` pick measurements and stores; `--rounds N` gives every measurement
N rounds. A benchmark that fails on one commit gets a row saying why, and the
command exits with 1.

{scale_results}
{burst_results}
{ledger_results}
{console_results}
## Latest results

{results}"""


if __name__ == "__main__":
    sys.exit(main())
