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

pytest_cmd=(.venv/bin/python -m pytest -p no:cacheprovider -ra)

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
    "${pytest_cmd[@]}" -n 0 "$@" || status=$?
    check pytest "$status"
    exit 0
fi

# The whole suite as three streams side by side (a test process waits on its
# servers and replicas most of the time: one uses about 0.4 of a core):
# - the tests marked `timing` (any sub-second bound on real time: hand-overs,
#   wake-ups, store deadlines) one at a time: two at once overran hand-over
#   bounds by tens of milliseconds;
# - the tests marked `paced` (fake or skewed clocks, timed edit scripts: bounds
#   of a second or more) one at a time;
# - the compatibility matrix's oldest and newest cells (README, "Run the tests":
#   the floors pyproject.toml declares and the newest releases, on the oldest and
#   newest Python), then every other test on two pytest-xdist workers, a test
#   file per worker (their fixtures are per module).
# The timing stream runs at normal priority, paced at nice 5 and the rest at nice
# 10 (their servers and replicas inherit it): on 2 shared cores, hand-overs timed
# while the other streams were busy were silent up to 0.705 s against a 0.7 s
# bound, and alone they take about 0.24 s. The other streams' bounds are seconds
# (CONTRIBUTING.md, "The three streams and the marks").
# Each line is prefixed with its stream's name, and each pytest run ends with its
# 15 slowest tests, to keep the streams even. The streams' lines interleave, so
# the failures of all three are repeated together at the end.
echo "==> pytest -m timing  |  pytest -m paced  |  scripts/matrix.py, then pytest -n 2"
logs=$(mktemp -d)
stream() {  # $1: the stream's name, $2: its niceness; the rest: its pytest arguments
    local name=$1 niceness=$2
    shift 2
    set +e
    nice -n "$niceness" "${pytest_cmd[@]}" --durations=15 "$@" 2>&1 | sed -u "s/^/[$name] /" \
        | tee -a "$logs/$name"
    exit "${PIPESTATUS[0]}"
}
(stream timing 0 -n 0 -m timing) &
timing_pid=$!
(stream paced 5 -n 0 -m paced) &
paced_pid=$!
(
    set -o pipefail
    nice -n 10 .venv/bin/python scripts/matrix.py oldest-3.10 newest-3.13 2>&1 | sed -u 's/^/[rest] /' \
        | tee -a "$logs/rest" || { echo "FAILED: compatibility matrix" >&2; exit 1; }
    stream rest 10 -n 2 --dist loadfile -m "not timing and not paced"
) &
rest_pid=$!
statuses=()
for pid in "$timing_pid" "$paced_pid" "$rest_pid"; do
    status=0
    wait "$pid" || status=$?
    statuses+=("$status")
done
failures=$(grep -hE '^\[[a-z]+\] (FAILED|ERROR) |^\[rest\] \| [^|]+ \| FAILED' "$logs"/* || true)
if [[ -n $failures ]]; then
    echo "==> what failed, in all three streams" >&2
    echo "$failures" >&2
fi
rm -rf "$logs"
check "pytest -m timing" "${statuses[0]}"
check "pytest -m paced" "${statuses[1]}"
check "the matrix, then pytest -m 'not timing and not paced'" "${statuses[2]}"
echo "==> all three streams passed"
