#!/usr/bin/env bash
# One command: install everything, then run the whole test suite (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
exec python -m pytest -n 2 --dist loadfile -q "$@"
