"""Before / after: the regression benchmarks on two commits, in one run, as one table.

    .venv/bin/python benchmarks/compare.py BEFORE AFTER [--quick] [--rounds N]
        [--only failover,store_load,dispatch,scale,tick_cost,leader_only]
        [--stores redis,postgres,mysql,etcd,file] [--cache DIR]

Each commit gets a git worktree of its own under ``--cache`` (default
``/tmp/celery-leader-compare/<sha>``), and in it a ``.venv`` made by that
commit's own ``scripts/setup.sh``; both are reused when they exist. Every
benchmark then runs in each worktree with that worktree's venv and files, in
rounds: before, after, before, after, ..., so that drift in the machine's speed
hits both alike. Each measurement's rounds run back to back. The benchmarks are
the ones in ``benchmarks/`` at each commit; their own printed output is parsed:

* ``failover``: graceful stop and SIGKILL of the publishing ``celery beat``
  replica, per store (``benchmarks/failover.py``'s systems, one of each fault a
  round): the longest silence at the broker, seconds.
* ``store_load``: ``python -m benchmarks.store_load``: store round trips per
  holder per second, and how long until all 20 elections are led again after a
  SIGKILL of every holder.
* ``dispatch``: ``python -m benchmarks.bench_dispatch --rounds 1`` once a round:
  10,000 entries due at once, LeaderScheduler against a bare ``send_task`` loop.
* ``scale``: ``python -m benchmarks.scale --n 100000 --only leader``: the
  leader's CPU seconds per second and RSS with 100,000 code entries, idle.
* ``tick_cost``: ``python -m benchmarks.tick_cost --one 100000``: the median idle
  tick at 100,000 entries.
* ``leader_only``: ``python -m benchmarks.bench_leader_only``: ns per call.

Cells show the median over the rounds, with the lowest and highest in brackets
when there is more than one. ``--quick`` runs one round of each at the smallest
sizes: a smoke test of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.procs import signal_orphans

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path("/tmp/celery-leader-compare")
STORES = ("redis", "postgres", "mysql", "etcd", "file")
#: Seconds one benchmark invocation may take before it is killed (its process group).
TIMEOUT = 1800

_START = time.monotonic()


def log(line: str) -> None:
    elapsed = int(time.monotonic() - _START)
    print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {line}", file=sys.stderr, flush=True)


def _env(root: Path | None = None) -> dict[str, str]:
    """This environment without any venv or PYTHONPATH; with ``root``'s venv first."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    paths = [p for p in env.get("PATH", "").split(os.pathsep) if not p.endswith("/.venv/bin")]
    if root is not None:
        env["VIRTUAL_ENV"] = str(root / ".venv")
        env["PYTHONPATH"] = str(root)
        paths.insert(0, str(root / ".venv" / "bin"))
    env["PATH"] = os.pathsep.join(paths)
    return env


@dataclass
class Side:
    """One commit: its worktree, with a venv of its own."""

    label: str
    sha: str
    root: Path

    def python(self, *argv: str, timeout: float = TIMEOUT) -> str:
        """Stdout of ``python ARGV`` run with this commit's venv in its worktree."""
        proc = subprocess.Popen(
            [str(self.root / ".venv" / "bin" / "python"), *argv],
            cwd=self.root,
            env=_env(self.root),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its servers and beats die with its group
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"took more than {timeout:g} s") from None
        finally:
            signal_orphans(proc.pid, signal.SIGKILL)  # what it left behind (it is reaped)
        if proc.returncode != 0:
            tail = (err.strip() or out.strip())[-400:]
            raise RuntimeError(f"exited with {proc.returncode}: {tail}")
        return out


def prepare(label: str, rev: str, cache: Path) -> Side:
    """A worktree of ``rev`` under ``cache`` with its own ``.venv``, made or reused."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if found.returncode != 0:
        raise SystemExit(f"{rev}: no such commit in {ROOT}")
    sha = found.stdout.strip()
    root = cache / sha
    if not (root / ".git").exists():
        log(f"{label}: git worktree of {sha[:10]} at {root}")
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=True)
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(root), sha],
            check=True,
        )
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if head != sha:
        raise SystemExit(f"{root} is at {head}, not {sha}: remove it and run again")
    log(f"{label}: {sha[:10]}: scripts/setup.sh (quick when its venv is there)")
    done = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=root, env=_env(), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{root}: scripts/setup.sh failed:\n{done.stdout}{done.stderr}")
    return Side(label, sha, root)


# -- parsing what the benchmarks print -----------------------------------------


def md_rows(text: str) -> list[dict[str, str]]:
    """Every row of every Markdown table in ``text``, as {column heading: cell}."""
    rows: list[dict[str, str]] = []
    head: list[str] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            head = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if head is None:
            head = cells
        elif not all(re.fullmatch(r":?-+:?", c) for c in cells if c):
            rows.append(dict(zip(head, cells, strict=False)))
    return rows


def number(cell: str) -> float:
    """The first number in a cell: ``1,234``, ``0.55 round trips/s``, ``1.23 s (...)``."""
    match = re.search(r"-?\d[\d,]*(?:\.\d+)?", cell)
    if match is None:
        raise ValueError(f"no number in {cell!r}")
    return float(match.group().replace(",", ""))


def row_named(rows: list[dict[str, str]], column: str, start: str) -> dict[str, str]:
    for row in rows:
        if row.get(column, "").startswith(start):
            return row
    raise ValueError(f"no row whose {column!r} starts with {start!r}")


# -- the measurements --------------------------------------------------------------

#: Runs in a commit's worktree: its failover benchmark, graceful and SIGKILL only,
#: on the stores named in argv[1]; prints {store: {fault: [gap, censored]}} as JSON.
FAILOVER = """
import dataclasses, json, sys
from benchmarks import failover
wanted = sys.argv[1].split(",")
systems = tuple(
    dataclasses.replace(s, only=("graceful", "sigkill"))
    for s in failover.SYSTEMS if s.kind == "leader" and s.store in wanted
)
results = failover.run(1, False, lambda line: print(line, file=sys.stderr), systems)
print(json.dumps({
    r.system.store: {t.fault: [t.gap, t.censored] for t in r.trials}
    | ({"skipped": r.skipped} if r.skipped else {})
    for r in results
}))
"""
STORE_LABELS = {"redis": "Redis", "postgres": "PostgreSQL", "mysql": "MariaDB", "etcd": "etcd"}

#: One round's numbers: {row label: value}; a row missing is "not measured".
Values = dict[str, float]


def failover_round(side: Side, quick: bool, stores: list[str]) -> Values:
    out = json.loads(side.python("-c", FAILOVER, ",".join(stores)).strip().splitlines()[-1])
    values: Values = {}
    for store in stores:
        result = out.get(store)
        if result is None:
            continue  # this commit has no such store
        if "skipped" in result:
            log(f"  {side.label}: failover on {store} skipped: {result['skipped']}")
        for fault, label in (("graceful", "graceful stop"), ("sigkill", "SIGKILL")):
            if fault in result:
                gap, censored = result[fault]
                mark = " (none within 15 s)" if censored else ""
                values[f"hand-over, {label}, {store}: s{mark}"] = gap
    return values


def store_load_round(side: Side, quick: bool, stores: list[str]) -> Values:
    wanted = [s for s in stores if s in STORE_LABELS]
    if not wanted:
        return {}
    out = side.python("-m", "benchmarks.store_load", *(["--quick"] if quick else []), *wanted)
    rows = md_rows(out)
    values: Values = {}
    for store in wanted:
        try:
            row = row_named(rows, "store", STORE_LABELS[store])
        except ValueError:
            continue
        per_holder = next((v for k, v in row.items() if k == "per holder"), "")
        if not per_holder or per_holder.startswith("skipped"):
            log(f"  {side.label}: store load on {store}: {row}")
            continue
        values[f"store round trips per holder per second, {store}"] = number(per_holder)
        kill = next(v for k, v in row.items() if k.startswith("every election led again"))
        if not kill.startswith("not within"):
            values[f"all 20 elections led again after SIGKILL of all holders, {store}: s"] = number(
                kill
            )
    return values


def dispatch_round(side: Side, quick: bool, stores: list[str]) -> Values:
    entries = 1000 if quick else 10_000
    extra = ["--entries", str(entries), "--limit", "5"] if quick else []
    out = side.python("-m", "benchmarks.bench_dispatch", "--rounds", "1", *extra)
    match = re.search(r"LeaderScheduler / send_task loop = ([\d.]+)", out)
    if match is None:
        raise ValueError(f"no 'LeaderScheduler / send_task loop' line in: {out[-300:]}")
    leader = row_named(md_rows(out), "dispatcher", "LeaderScheduler")
    return {
        f"{entries:,} due at once: LeaderScheduler / send_task loop": float(match.group(1)),
        f"{entries:,} due at once: LeaderScheduler msgs/s": number(leader["msgs/s"]),
    }


def scale_round(side: Side, quick: bool, stores: list[str]) -> Values:
    n = 1000 if quick else 100_000
    argv = ["--n", str(n), "--only", "leader", "--store-n", "0", "--burst", "0"]
    if quick:
        argv += ["--seconds", "3", "--cap", "120"]
    row = row_named(
        md_rows(side.python("-m", "benchmarks.scale", *argv)), "system", "celery-leader"
    )
    return {
        f"idle leader beat, {n:,} code entries: CPU s/s": number(row["CPU s/s"]),
        f"idle leader beat, {n:,} code entries: RSS MB": number(row["RSS MB"]),
    }


def tick_cost_round(side: Side, quick: bool, stores: list[str]) -> Values:
    n = 1000 if quick else 100_000
    out = side.python("-m", "benchmarks.tick_cost", "--one", str(n))
    row = json.loads(out.strip().splitlines()[-1])
    return {f"idle tick, {n:,} entries, memory store: ms": float(row["idle_ms"])}


def leader_only_round(side: Side, quick: bool, stores: list[str]) -> Values:
    calls = 20_000 if quick else 200_000
    out = side.python("-m", "benchmarks.bench_leader_only", "--calls", str(calls))
    rows = md_rows(out)
    values = {
        "@leader_only, in-process: ns per call": number(
            row_named(rows, "call", "@leader_only, in-process")["ns per call"]
        ),
        "@leader_only, forked child: ns per call": number(
            row_named(rows, "call", "@leader_only, forked child")["ns per call"]
        ),
    }
    match = re.search(r"Decorator overhead: ([\d,]+) ns per call = ([\d.]+)%", out)
    if match is not None:
        values["@leader_only overhead: % of one Redis GET"] = float(match.group(2))
    return values


@dataclass
class Measurement:
    key: str
    run: Callable[[Side, bool, list[str]], Values]
    #: Rounds of before-then-after; each benchmark invocation is one round.
    rounds: int
    #: Minutes one round takes on both commits together, roughly (for the estimate).
    minutes: float
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


#: Minutes a round takes: from --quick runs on a busy 2-CPU machine, scaled to the
#: full sizes (failover: all five stores; dispatch: PersistentScheduler runs its 20 s).
MEASUREMENTS = (
    Measurement("failover", failover_round, 5, 1.8),
    Measurement("store_load", store_load_round, 2, 4.2),
    Measurement("dispatch", dispatch_round, 5, 1.0),
    Measurement("scale", scale_round, 2, 2.5),
    Measurement("tick_cost", tick_cost_round, 3, 0.8),
    Measurement("leader_only", leader_only_round, 3, 0.5),
)


# -- the table ------------------------------------------------------------------


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def cell(values: list[float] | None) -> str:
    if not values:
        return "—"
    median = _fmt(statistics.median(values))
    if len(values) == 1:
        return median
    return f"{median} ({_fmt(min(values))}-{_fmt(max(values))})"


def table(measurements: list[Measurement], sides: tuple[Side, Side]) -> str:
    before, after = sides
    lines = [
        f"| measurement | before ({before.sha[:7]}) | after ({after.sha[:7]}) | after/before |",
        "|---|---:|---:|---:|",
    ]
    for m in measurements:
        labels = list(m.values.get(before.label, {}))
        labels += [k for k in m.values.get(after.label, {}) if k not in labels]
        for label in labels:
            a = m.values.get(before.label, {}).get(label)
            b = m.values.get(after.label, {}).get(label)
            ratio = "—"
            if a and b and statistics.median(a) != 0:
                ratio = f"{statistics.median(b) / statistics.median(a):.2f}"
            lines.append(f"| {label} | {cell(a)} | {cell(b)} | {ratio} |")
        for side, why in m.failed.items():
            lines.append(f"| {m.key}: failed on {side} | {why[:200].replace('|', '/')} | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("before", help="a commit, e.g. 0cc6647")
    parser.add_argument("after", help="a commit or branch, e.g. int")
    parser.add_argument(
        "--quick", action="store_true", help="one round, smallest sizes: a smoke test"
    )
    parser.add_argument(
        "--rounds", type=int, help="rounds of every measurement (default: each its own)"
    )
    parser.add_argument(
        "--only", help=f"measurements, from {','.join(m.key for m in MEASUREMENTS)}"
    )
    parser.add_argument(
        "--stores", default=",".join(STORES), help="stores for failover, store_load"
    )
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the worktrees go")
    args = parser.parse_args(argv)
    chosen = [m for m in MEASUREMENTS if not args.only or m.key in args.only.split(",")]
    stores = [s for s in args.stores.split(",") if s]
    if unknown := set(stores) - set(STORES):
        parser.error(f"unknown stores {', '.join(sorted(unknown))}")

    sides = (prepare("before", args.before, args.cache), prepare("after", args.after, args.cache))
    load, started = os.getloadavg()[0], time.monotonic()
    if not args.quick:
        minutes = sum(m.minutes * (args.rounds or m.rounds) for m in chosen)
        log(f"about {minutes:.0f} min with every store, on an idle machine")
    for m in chosen:
        rounds = 1 if args.quick else (args.rounds or m.rounds)
        for round_ in range(rounds):
            for side in sides:
                if side.label in m.failed:
                    continue
                log(f"{m.key}: round {round_ + 1} of {rounds}, {side.label}")
                try:
                    values = m.run(side, args.quick, stores)
                except (RuntimeError, ValueError, KeyError, StopIteration) as exc:
                    log(f"  failed: {exc}")
                    m.failed[side.label] = str(exc).splitlines()[-1] if str(exc) else repr(exc)
                    continue
                for label, value in values.items():
                    m.values.setdefault(side.label, {}).setdefault(label, []).append(value)
    minutes = (time.monotonic() - started) / 60
    print(
        f"_{'Quick smoke run, not a measurement: ' if args.quick else ''}"
        f"before {args.before} ({sides[0].sha[:10]}), after {args.after} ({sides[1].sha[:10]}); "
        f"{datetime.date.today().isoformat()}, {os.cpu_count()} CPUs, load average "
        f"{load:.2f} at the start and {os.getloadavg()[0]:.2f} at the end; took "
        f"{minutes:.1f} min. Median over the rounds (lowest-highest), each round "
        "before then after._\n"
    )
    print(table(chosen, sides))
    return 1 if any(m.failed for m in chosen) else 0


if __name__ == "__main__":
    sys.exit(main())
