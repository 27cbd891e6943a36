#!/usr/bin/env bash
# Runs the whole suite N times, each on a clean clone of HEAD, one run after the
# other, and prints a table: run, commit, start time, duration, exit status and
# the tests that failed. Usage: `bash scripts/repeat.sh N` (see CONTRIBUTING.md,
# "Reproduce an intermittent failure").
#
# Each run is `bash .ci/run` in a fresh `git clone` (its own .venv, made by
# scripts/setup.sh from the pip and uv caches in ~/.cache, so every run but
# the first installs in a minute or two), so nothing left by an earlier run
# (a venv, a .matrix cell, a file a test forgot) can make it pass or fail. The
# clone is removed after its run; its whole output is kept in the log directory
# named at the start, one file per run, beside the table (table.md).
set -euo pipefail

# The failed tests of one run's output ($1), one a line: the lines scripts/test.sh
# repeats after "==> what failed, in all three streams" (`[stream] FAILED id - why`,
# `[stream] ERROR id - why`, `[rest] | cell | FAILED | ...` of the matrix). A run
# that stopped before the tests (setup, ruff, mypy, mkdocs) or whose pytest
# failed without a test to name gives its `FAILED: what` line instead.
failures() {
    local line found=() in_block=0 stream what rest
    while IFS= read -r line; do
        if [[ $line == "==> what failed, in all three streams" ]]; then
            in_block=1
        elif ((in_block)) && [[ $line =~ ^\[([a-z]+)\]\ (FAILED|ERROR)\ (.+)$ ]]; then
            stream=${BASH_REMATCH[1]} what=${BASH_REMATCH[2]} rest=${BASH_REMATCH[3]}
            if [[ $what == ERROR ]]; then
                stream+=", error"
            fi
            found+=("${rest%% - *} ($stream)")
        elif ((in_block)) && [[ $line =~ ^\[rest\]\ \|\ ([^|]*[^ |])\ *\|\ FAILED\ \| ]]; then
            found+=("matrix cell ${BASH_REMATCH[1]} (rest)")
        fi
    done <"$1"
    if ((${#found[@]} == 0)); then
        while IFS= read -r line; do
            if [[ $line == "FAILED: "* ]]; then
                found+=("${line#FAILED: }")
            fi
        done <"$1"
    fi
    if ((${#found[@]} > 0)); then
        printf '%s\n' "${found[@]}"
    fi
}

main() {
    if [[ $# -ne 1 || ! $1 =~ ^[1-9][0-9]*$ ]]; then
        echo "usage: bash scripts/repeat.sh N   (N >= 1 whole runs of the suite)" >&2
        exit 2
    fi
    local runs=$1 repo commit logs
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    commit=$(git -C "$repo" rev-parse HEAD)
    if [[ -n $(git -C "$repo" status --porcelain --untracked-files=no) ]]; then
        echo "repeat: uncommitted changes are not in the clones; running HEAD ${commit:0:9}" >&2
    fi
    logs=$(mktemp -d "${TMPDIR:-/tmp}/celery-leader-repeat.XXXXXX")
    echo "==> $runs run(s) of bash .ci/run on clean clones of ${commit:0:9}; logs in $logs"

    local table="$logs/table.md" i clone log start began took status failed red=0
    {
        echo "| run | commit | start (UTC) | duration | exit | failed |"
        echo "|---|---|---|---|---|---|"
    } >"$table"
    for ((i = 1; i <= runs; i++)); do
        clone="$logs/clone"
        log="$logs/run-$i.log"
        rm -rf "$clone"
        # A clone holds the branches, not a detached HEAD: fetch the commit itself.
        git clone -q --no-checkout "$repo" "$clone"
        git -C "$clone" fetch -q "$repo" "$commit"
        git -C "$clone" checkout -q --detach "$commit"
        start=$(date -u '+%Y-%m-%d %H:%M:%S')
        began=$SECONDS
        echo "==> run $i of $runs, started $start UTC, output in $log"
        status=0
        (cd "$clone" && bash .ci/run) >"$log" 2>&1 || status=$?
        took=$((SECONDS - began))
        rm -rf "$clone"
        ((status == 0)) || red=$((red + 1))
        failed=$(failures "$log" | paste -sd ';' | sed 's/;/; /g')
        printf '| %d | %s | %s | %dm%02ds | %d | %s |\n' "$i" "${commit:0:9}" "$start" \
            $((took / 60)) $((took % 60)) "$status" "${failed:--}" >>"$table"
        tail -n 1 "$table"
    done
    echo
    cat "$table"
    echo "$((runs - red)) of $runs run(s) green (logs and this table: $logs)"
    ((red == 0))
}

# Sourced (by tests/test_repeat_runner.py), it only defines the functions.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
