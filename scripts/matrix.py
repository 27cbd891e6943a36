"""The compatibility matrix: a fast subset of the suite on each Python and dependency set.

    python scripts/matrix.py                          # every cell: 4 Pythons x oldest/newest
    python scripts/matrix.py oldest-3.10 newest-3.13  # what CI runs

A cell is a Python (3.10 to 3.13) and a dependency set, installed with uv into a
fresh virtualenv under ``.matrix/``:

* ``oldest``: ``uv pip install --resolution lowest-direct``, the lowest version of
  every requirement ``pyproject.toml`` declares (Celery, kombu, Dramatiq, redis-py,
  psycopg, etcd3gw, Django, django-celery-beat, ...): the floors are what this cell
  proves, not a list kept by hand beside them;
* ``newest``: the newest release of each.

Why uv and not nox or pip: only uv resolves to the declared floors
(``lowest-direct``), and it installs a cell in seconds from its cache, which is
what lets CI run two cells on every change.

The subset: the unit tests, the store contract on Redis, PostgreSQL, etcd and
MariaDB, a real three-beat fail-over on Redis and a Dramatiq scheduler fail-over. It prints
one line per cell and exits 1 when any cell failed. Needs uv (in the dev group)
and the servers ``scripts/setup.sh`` installs.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
DEPS = ("oldest", "newest")
#: Every extra: the matrix covers each store client and both frameworks.
EXTRAS = "celery,dramatiq,redis,postgres,django,metrics,etcd,mysql"
#: What the tests themselves import (pika: Dramatiq's RabbitMQ broker in unit tests).
TEST_REQUIREMENTS = ("pytest>=8", "pytest-timeout>=2.2", "pika>=1.3")

UNIT = [
    "tests/test_config.py",
    "tests/test_lease_unit.py",
    "tests/test_beat_unit.py",
    "tests/test_dramatiq_unit.py",
    "tests/test_startup_errors.py",
]
CONTRACT = ["tests/test_backend_contract.py", "-k", "redis or postgres or etcd or mariadb"]

#: The fast subset, one pytest run per group (so that -k applies to one file).
#: The tests of a group marked ``timing`` (sub-second bounds) run in a group of
#: their own, among the timed ones.
GROUPS: dict[str, list[str]] = {
    "unit": [*UNIT, "-m", "not timing"],
    "contract": [*CONTRACT, "-m", "not timing"],
    "unit-timing": [*UNIT, "-m", "timing"],
    "contract-timing": [*CONTRACT, "-m", "timing"],
    # Three `celery beat` on Redis at the default ttl, the leader SIGKILLed three times.
    "beat-failover": [
        "tests/test_beat_chaos.py::"
        "test_three_beats_at_the_default_ttl_replace_a_crashed_leader_within_half_a_second"
    ],
    # Three Dramatiq replicas on a Redis broker and a PostgreSQL store: the
    # scheduler's leader killed (group, fork, main process), nothing sent twice.
    "dramatiq-failover": [
        "tests/test_dramatiq_chaos.py::"
        "test_crashes_are_detected_at_once_on_postgres_mariadb_and_file[postgres]"
    ],
}
#: The groups that bound hand-over times or other latencies: never two at once
#: (see run_cells).
TIMED = ("unit-timing", "contract-timing", "beat-failover", "dramatiq-failover")


def find_python(version: str) -> str:
    """An interpreter of ``version``: ``pythonX.Y`` on PATH, else one pyenv installed."""
    candidates = [shutil.which(f"python{version}")]
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python{version}"))
    for candidate in candidates:
        # A pyenv shim exists for every installed version but runs only the selected one.
        if candidate and subprocess.run([candidate, "-V"], capture_output=True).returncode == 0:
            return candidate
    raise SystemExit(f"matrix: no Python {version} found (PATH or pyenv)")


def uv() -> str:
    """The uv of this virtualenv, else the one on PATH."""
    local = Path(sys.executable).parent / "uv"
    found = str(local) if local.exists() else shutil.which("uv")
    if found is None:
        raise SystemExit("matrix: uv is not installed (pip install uv, or the dev group)")
    return found


def install(cell: str, version: str, deps: str) -> Path:
    """A fresh virtualenv for ``cell`` with the package, every extra and the test tools."""
    venv = ROOT / ".matrix" / cell
    subprocess.run(
        [uv(), "venv", "-q", "--clear", "--python", find_python(version), str(venv)], check=True
    )
    python = venv / "bin" / "python"
    resolution = ["--resolution", "lowest-direct"] if deps == "oldest" else []
    subprocess.run(
        [uv(), "pip", "install", "-q", "--python", str(python), *resolution,
         f"{ROOT}[{EXTRAS}]", *TEST_REQUIREMENTS],
        check=True,
        cwd=ROOT,
    )  # fmt: skip
    return python


def versions(python: Path) -> str:
    """The versions this cell tested, for its line in the table."""
    listed = subprocess.run(
        [uv(), "pip", "list", "--python", str(python), "--format", "freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    wanted = ("celery", "kombu", "dramatiq", "redis", "psycopg", "etcd3gw", "django",
              "django-celery-beat")  # fmt: skip
    found = dict(line.split("==", 1) for line in listed.splitlines() if "==" in line)
    return " ".join(f"{name} {found[name]}" for name in wanted if name in found)


def run_group(python: Path, group: str) -> tuple[bool, str]:
    """Run one group of the subset; returns (passed, pytest's output)."""
    run = subprocess.run(
        [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *GROUPS[group]],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return run.returncode == 0, run.stdout + run.stderr


def run_cells(cells: list[str]) -> list[tuple[str, bool, str]]:
    """Install and test ``cells`` (``oldest-3.10``, ...); returns (cell, passed, summary) each.

    Installs and the groups that assert no sub-second bound run for every cell at
    once (two at a time, one per core); the timed groups (tests marked
    ``timing``, the fail-overs) one cell after another, so that two never share
    the cores.
    """
    started = time.monotonic()
    untimed = [(cell, group) for cell in cells for group in GROUPS if group not in TIMED]
    with ThreadPoolExecutor(max_workers=2) as pool:
        installed = pool.map(lambda cell: install(cell, *reversed(cell.split("-", 1))), cells)
        pythons = dict(zip(cells, installed, strict=True))
        ran = pool.map(lambda cell_group: run_group(pythons[cell_group[0]], cell_group[1]), untimed)
        results = dict(zip(untimed, ran, strict=True))
    for cell in cells:
        for group in TIMED:
            results[cell, group] = run_group(pythons[cell], group)
    took = time.monotonic() - started
    table = []
    for cell in cells:
        passed = True
        parts = []
        for group in GROUPS:
            ok, output = results[cell, group]
            print(f"==> matrix cell {cell}, {group}\n{output}", flush=True)
            parts.append(f"{group} {'ok' if ok else 'FAILED'}")
            passed = passed and ok
        summary = f"{', '.join(parts)}; {versions(pythons[cell])}"
        table.append((cell, passed, summary))
    print(f"==> matrix: {len(cells)} cell(s) in {took:.0f} s", flush=True)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = [f"{deps}-{version}" for version in PYTHONS for deps in DEPS]
    parser.add_argument("cells", nargs="*", choices=[[], *every], metavar="CELL",
                        help=f"cells to run (default: all of {', '.join(every)})")  # fmt: skip
    cells = parser.parse_args().cells or every
    table = run_cells(cells)
    print("\n| cell | result | what ran |\n|---|---|---|")
    for cell, passed, summary in table:
        print(f"| {cell} | {'passed' if passed else 'FAILED'} | {summary} |")
    return 0 if all(passed for _, passed, _ in table) else 1


if __name__ == "__main__":
    sys.exit(main())
