#!/usr/bin/env bash
# Create ./.venv (if missing) and install the package with its dev extra. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Debian's packages for the tests, in one apt-get call: PostgreSQL (the Postgres tier's fixture runs initdb and the
# server itself, on loopback), Chromium (the browser tier drives it headless through Playwright, by path) and
# eatmydata (scripts/test.sh runs the suite with fsync a no-op)
APT=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || APT+=(postgresql)
[[ -x /usr/bin/chromium ]] || APT+=(chromium)
command -v eatmydata >/dev/null || APT+=(eatmydata)
if (( ${#APT[@]} )); then
  { [[ $(id -u) -eq 0 ]] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${APT[@]}" >/dev/null; } || echo "setup: ${APT[*]} missing (apt-get install ${APT[*]} as root): the Postgres and browser tiers fail without theirs; without eatmydata the suite is only slower" >&2
fi
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[dev]"
