#!/usr/bin/env bash
# One command: install everything, then run the whole test suite (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
# a file per worker at a time, longest first (batch_pipeline_tests/file_order.py), so both end together
exec python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q "$@"
