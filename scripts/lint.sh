#!/usr/bin/env bash
# Lint as CI does: ruff's rules (pyproject.toml [tool.ruff]) and its formatter, checked, never rewritten here; then
# the docs (mkdocs.yml, docs/), built strict: a page missing from the nav, a broken link or anchor fails.
# Fix locally with: ruff check --fix . && ruff format .   Read the docs with: mkdocs serve
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
ruff check .
ruff format --check .
# into a temporary folder, so a lint run leaves nothing in the checkout (site/ is ignored anyway)
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
# (never --quiet: it hides the warnings that --strict counts, and a broken link would pass)
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$SITE"
