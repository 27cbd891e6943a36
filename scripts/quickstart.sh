#!/usr/bin/env bash
# The quickstart: set up (venv, packages) and run the demo of three beat
# replicas and a worker on the embedded stores. Extra arguments go to the
# demo, e.g. --short, --leader-url redis://127.0.0.1:6379/0.
# With --dramatiq first: three Dramatiq replicas on a redis-server of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ "${1:-}" == "--dramatiq" ]]; then
    shift
    exec .venv/bin/python example_project/dramatiq_quickstart.py "$@"
fi
exec .venv/bin/python example_project/quickstart.py "$@"
