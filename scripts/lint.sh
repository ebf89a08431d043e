#!/usr/bin/env bash
# Lint as CI does: ruff's rules (pyproject.toml [tool.ruff]) and its formatter, checked, never rewritten here.
# Fix locally with: ruff check --fix . && ruff format .
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
ruff check .
ruff format --check .
