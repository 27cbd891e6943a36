#!/usr/bin/env bash
# Every check CI runs, in order, stopping at the first that fails. Arguments go to
# pytest, e.g. `bash scripts/test.sh tests/test_infra.py -k proxy`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail() {
    echo "FAILED: $*" >&2
    exit 1
}

bash scripts/setup.sh || fail "setup (scripts/setup.sh)"

lint_dirs=()
for dir in celery_leader tests harness benchmarks example_project; do
    [[ -d $dir ]] && lint_dirs+=("$dir")
done
echo "==> ruff check ${lint_dirs[*]}"
.venv/bin/ruff check "${lint_dirs[@]}" || fail "ruff check"

echo "==> mypy --strict celery_leader"
.venv/bin/mypy --strict celery_leader || fail "mypy --strict celery_leader"

if [[ -f mkdocs.yml ]]; then
    echo "==> mkdocs build --strict"
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -q -d "$site" || fail "mkdocs build --strict"
fi

# The compatibility matrix's oldest and newest cells (README, "Run the tests"):
# the floors pyproject.toml declares and the newest releases, on the oldest and
# newest Python. Only on a whole run: arguments narrow the run to some tests.
# Before pytest, so that pytest's summary is the run's closing line.
if (($# == 0)); then
    echo "==> scripts/matrix.py oldest-3.10 newest-3.13"
    .venv/bin/python scripts/matrix.py oldest-3.10 newest-3.13 || fail "compatibility matrix"
fi

# One process (no pytest-xdist workers): with the chaos tests of 0.4 (a 3+3 Redis
# Cluster, MariaDB, libfaketime fleets) two workers on two cores overran hand-over
# bounds by tens of milliseconds in two full runs out of two. `-n 2` halves the
# wall time where there is room.
echo "==> pytest -n 0 $*"
status=0
.venv/bin/python -m pytest -p no:cacheprovider -ra -n 0 "$@" || status=$?
case $status in
    0) ;;
    # Exit 5 means no test ran: a green run that tested nothing must not pass.
    5) fail "pytest collected no tests" ;;
    *) fail "pytest (exit status $status)" ;;
esac
