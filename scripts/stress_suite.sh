#!/usr/bin/env bash
# The whole suite N times in a row (default 3) while `stress-ng --cpu 2` keeps two CPU hogs running beside it: the
# load a shared CI machine puts on timers, sleeps and process start-up. Stops at the first red run. Arguments after
# N go to pytest (through scripts/test.sh). Needs stress-ng (Debian: apt-get install stress-ng).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
shift || true
command -v stress-ng >/dev/null || { echo "stress-ng is not installed: apt-get install stress-ng" >&2; exit 2; }
stress-ng --cpu 2 --quiet &
hog=$!
trap 'kill "$hog" 2>/dev/null || true; wait "$hog" 2>/dev/null || true' EXIT
for i in $(seq 1 "$runs"); do
  started=$(date +%s)
  echo "suite run $i of $runs under stress-ng --cpu 2"
  ./scripts/test.sh "$@" || { echo "suite run $i of $runs failed after $(( $(date +%s) - started )) s"; exit 1; }
  echo "suite run $i of $runs passed in $(( $(date +%s) - started )) s"
done
