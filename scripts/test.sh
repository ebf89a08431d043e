#!/usr/bin/env bash
# One command: install everything, then run the whole test suite (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
# One worker more than there are cores: with one per core, 30% of the CPU sat idle while tests waited on the
# sandbox's clock, sensor ticks and `dagster dev`'s run workers (on 2 cores: 650 s with 2 workers, 532-537 s with
# 3, 531 s with 4 at 5% idle). At most 8: each worker and its CLI fork server hold ~1.2 GB, and it starts its own
# Postgres and sandboxes. `-n N` among the arguments overrides it.
workers=$(($(nproc) + 1))
workers=$((workers > 8 ? 8 : workers))
# Bytecode is cached: with PYTHONDONTWRITEBYTECODE set, every worker re-ran pytest's assertion rewrite of every test
# module (collection 12.4 -> 7.1 CPU s per worker) and every CLI, code server and run worker the tests start
# compiled the package again.
unset PYTHONDONTWRITEBYTECODE
# fsync and sync are no-ops in the test processes (eatmydata, when installed; setup.sh installs it), as the Postgres
# fixture already runs with fsync=off. No test can tell: a crash test kills a process, and what it wrote is in the
# page cache; only a machine crash would lose it. Every Dagster run commits its SQLite event log and run storage
# many times, and each commit waited on the disk: 514 -> 468 s, 939 -> 859 busy CPU s (benchmarks/README.md).
no_fsync=()
command -v eatmydata >/dev/null && no_fsync=(eatmydata)
# a file per worker at a time, longest first (batch_pipeline_tests/file_order.py), so the workers end together
exec ${no_fsync[@]+"${no_fsync[@]}"} python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder -q "$@"
