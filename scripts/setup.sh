#!/usr/bin/env bash
# Create ./.venv (if missing) and install the package with its dev extra. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Debian's PostgreSQL for the Postgres test tier (the fixture runs initdb and the server itself, on loopback)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { [[ $(id -u) -eq 0 ]] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } || echo "setup: postgresql is missing (apt-get install postgresql as root); the Postgres tests will fail" >&2
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[dev]"
