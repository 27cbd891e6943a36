"""Redis Cluster master fail-overs with real schedulers, run again and again.

Run:  python -m benchmarks.cluster_failover [--runs N]   (prints Markdown)

Runs ``tests/test_cluster_failover_chaos.py`` ``--runs`` times (default 5):
3 beats, and 3 standalone Dramatiq schedulers, on a Redis Cluster of 3
masters + 3 replicas; the replica of the election's master lags or is cut
off, the master and the leading scheduler are SIGKILLed together, and the
replica is promoted with ``CLUSTER FAILOVER TAKEOVER``. Per scenario: the
first dispatch of another scheduler after the kill, the hand-over after a
SIGKILL of that new leader, slots sent during the fault (after the claims in
flight), and slots sent twice, over all runs.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(
    r"FAILOVER (?P<title>[^:]+): promoted (?P<promoted>[\d.]+) s after the kill; first dispatch "
    r"(?P<dispatch>[\d.]+) s after the kill; next hand-over (?P<handover>[\d.]+) s; "
    r"(?P<during>\d+) sent during the fault.*? (?P<twice>\d+) twice"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    rows: dict[str, list[re.Match[str]]] = defaultdict(list)
    failed = 0
    for n in range(runs):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-s", "-q",
             "tests/test_cluster_failover_chaos.py"],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        failed += done.returncode != 0
        for match in LINE.finditer(done.stdout):
            rows[match["title"]].append(match)
        print(f"run {n + 1}/{runs}: pytest exit {done.returncode}", file=sys.stderr)

    def span(values: list[float]) -> str:
        return f"{min(values):.2f} / {max(values):.2f}"

    print(f"{runs} runs, {failed} with a failed test\n")
    print(
        "| scenario | runs | promoted after the kill, min / max | first dispatch after the kill, "
        "min / max | next hand-over, min / max | sent during the fault (each run) | "
        "slots sent twice (each run) |"
    )
    print("|---|---:|---:|---:|---:|---|---|")
    for title, found in rows.items():
        print(
            f"| {title} | {len(found)} | {span([float(m['promoted']) for m in found])} s | "
            f"{span([float(m['dispatch']) for m in found])} s | "
            f"{span([float(m['handover']) for m in found])} s | "
            f"{', '.join(m['during'] for m in found)} | "
            f"{', '.join(m['twice'] for m in found)} |"
        )


if __name__ == "__main__":
    main()
