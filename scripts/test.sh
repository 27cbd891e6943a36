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
# Before pytest, so that the test results close the run.
if (($# == 0)); then
    echo "==> scripts/matrix.py oldest-3.10 newest-3.13"
    .venv/bin/python scripts/matrix.py oldest-3.10 newest-3.13 || fail "compatibility matrix"
fi

pytest_run() {
    .venv/bin/python -m pytest -p no:cacheprovider -ra -n 0 "$@"
}

check() {  # $1: what ran, $2: pytest's exit status
    case $2 in
        0) ;;
        # Exit 5 means no test ran: a green run that tested nothing must not pass.
        5) fail "$1 collected no tests" ;;
        *) fail "$1 (exit status $2)" ;;
    esac
}

if (($# > 0)); then
    echo "==> pytest -n 0 $*"
    status=0
    pytest_run "$@" || status=$?
    check pytest "$status"
    exit 0
fi

# The whole suite as two pytest processes side by side, one per core: the tests
# marked `timing` (hand-over bounds, libfaketime fleets at 60x) one at a time, and
# every other test. They take about as long as each other. Two timing tests at once
# (pytest-xdist -n 2) overran hand-over bounds by tens of milliseconds; and
# pytest-xdist's --dist loadgroup cannot keep them together under pytest 9.2 (it
# rewrites node ids, which pytest no longer reads). Each line is prefixed with
# its run's name; each ends with its 15 slowest tests, to keep the halves even.
echo "==> pytest -m timing  |  pytest -m 'not timing'"
(
    set +e
    pytest_run --durations=15 -m timing 2>&1 | sed -u 's/^/[timing] /'
    exit "${PIPESTATUS[0]}"
) &
timing_pid=$!
(
    set +e
    pytest_run --durations=15 -m "not timing" 2>&1 | sed -u 's/^/[rest]   /'
    exit "${PIPESTATUS[0]}"
) &
rest_pid=$!
timing_status=0
rest_status=0
wait "$timing_pid" || timing_status=$?
wait "$rest_pid" || rest_status=$?
check "pytest -m timing" "$timing_status"
check "pytest -m 'not timing'" "$rest_status"
echo "==> both pytest runs passed"
