#!/usr/bin/env bash
# One command: install everything, then run the demo job on the bundled sandbox through Dagster.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
exec batch-pipeline run data/jobs/demo.yaml "$@"
