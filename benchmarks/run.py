"""Every benchmark in one command; prints one Markdown report.

    .venv/bin/python benchmarks/run.py [--quick] [--reps N] [--publish]

Writes ``benchmarks/results/latest.md`` and ``benchmarks/results/failover.png``;
with ``--publish`` also the latest results of ``docs/benchmarks.md`` (its last
section) and ``docs/img/failover.png``.
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
from harness.procs import signal_orphans  # noqa: E402
from harness.servers import PG_BIN  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
#: The heading of the one section of ``docs/benchmarks.md`` that ``--publish`` writes,
#: to the end of the page. The sections above it hold the longer benchmarks' runs
#: (scale, bursts, the ledger and the console at volume, the soak), each pasted in by
#: hand with what it showed, so ``--publish`` leaves them as they are.
LATEST = "## Latest results\n"
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
#: take an hour: ``python -m benchmarks.scale``, in the page's own section. No burst:
#: section 4d is the bursts (the scale benchmark's default of 100,000 took it past
#: EXTERNAL_TIMEOUT).
SCALE = (
    "9. Scale: 1,000 hourly entries and one every second",
    "scale",
    ("--n", "1000", "--store-n", "0", "--only", "leader,redbeat", "--seconds", "15",
     "--burst", "0"),
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
        signal_orphans(proc.pid, signal.SIGKILL)  # what it left behind (it is reaped)
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


def published(page: str, body: str) -> str:
    """``page`` (the text of ``docs/benchmarks.md``) with its :data:`LATEST` section, to
    the end, replaced by ``body`` (this command's report, its headings one level down)."""
    head = page.partition(LATEST)[0]
    # One heading level down: the results sit under the page's own sections.
    results = re.sub(r"(?m)^(#{2,}) ", r"#\1 ", body)
    return f"{head}{LATEST}\n" + results.replace("(failover.png)", "(img/failover.png)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 run, fewer faults (~4 min)")
    parser.add_argument("--reps", type=int, help="runs of each fault (default 5; --quick: 1)")
    parser.add_argument(
        "--publish",
        action="store_true",
        help="also write the latest results of docs/benchmarks.md, and its plot",
    )
    args = parser.parse_args()
    if args.publish and LATEST not in (DOCS / "benchmarks.md").read_text():
        parser.error(f"docs/benchmarks.md has no {LATEST.strip()!r} heading to write under")
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
        page = published((DOCS / "benchmarks.md").read_text(), body)
        (DOCS / "benchmarks.md").write_text(page)
        log("wrote the latest results of docs/benchmarks.md, and docs/img/failover.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
