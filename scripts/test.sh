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

pytest_run() {
    .venv/bin/python -m pytest -p no:cacheprovider -ra "$@"
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
    pytest_run -n 0 "$@" || status=$?
    check pytest "$status"
    exit 0
fi

# The whole suite as two streams side by side. The tests marked `timing` (hand-over
# bounds, libfaketime fleets at 60x) run one at a time: two at once overran
# hand-over bounds by tens of milliseconds. Beside them, the compatibility matrix's
# oldest and newest cells (README, "Run the tests": the floors pyproject.toml
# declares and the newest releases, on the oldest and newest Python), then every
# other test on two pytest-xdist workers, a test file per worker (their fixtures are
# per module). The streams take about as long as each other; each line is prefixed
# with its stream's name, and each pytest run ends with its 15 slowest tests, to
# keep them even.
echo "==> pytest -m timing  |  scripts/matrix.py, then pytest -n 2 -m 'not timing'"
(
    set +e
    pytest_run -n 0 --durations=15 -m timing 2>&1 | sed -u 's/^/[timing] /'
    exit "${PIPESTATUS[0]}"
) &
timing_pid=$!
(
    set -o pipefail
    .venv/bin/python scripts/matrix.py oldest-3.10 newest-3.13 2>&1 | sed -u 's/^/[rest]   /' \
        || { echo "FAILED: compatibility matrix" >&2; exit 1; }
    set +e
    pytest_run -n 2 --dist loadfile --durations=15 -m "not timing" 2>&1 | sed -u 's/^/[rest]   /'
    exit "${PIPESTATUS[0]}"
) &
rest_pid=$!
timing_status=0
rest_status=0
wait "$timing_pid" || timing_status=$?
wait "$rest_pid" || rest_status=$?
check "pytest -m timing" "$timing_status"
check "the matrix, then pytest -m 'not timing'" "$rest_status"
echo "==> both streams passed"
