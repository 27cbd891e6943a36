#!/usr/bin/env bash
# The quickstart: set up (venv, packages) and run the demo of three beat
# replicas and a worker on the embedded stores. Extra arguments go to the
# demo, e.g. --short, --leader-url redis://127.0.0.1:6379/0.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python example_project/quickstart.py "$@"
