"""Longest test files first, so that the xdist workers finish together.

`scripts/test.sh` runs `--dist loadfile --no-loadscope-reorder`: a file is the unit of work and the workers take
the files in collection order, one at a time as each frees. Left to itself xdist orders files by their number of
tests, which put the few-test `dagster dev` and kill files (a minute each) last: one worker ran them alone for
minutes at the end. Ordering by measured seconds (longest first) leaves only short files for the end.

The seconds per file are in `file_seconds.json` beside this module. A file it does not list counts as
``UNKNOWN_FILE_S``. Refresh the list after a full run with
``BATCH_PIPELINE_RECORD_FILE_SECONDS=batch_pipeline_tests/file_seconds.json ./scripts/test.sh``.
"""

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

SECONDS_FILE = Path(__file__).with_name("file_seconds.json")
RECORD_ENV = "BATCH_PIPELINE_RECORD_FILE_SECONDS"
UNKNOWN_FILE_S = 5.0  # a new file: about the median file's time


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def known_seconds(path: Path = SECONDS_FILE) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def longest_files_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """``items`` regrouped by file, the files by descending seconds (ties: collection order), each file's tests in
    their collected order."""
    by_file: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_file[file_of(item.nodeid)].append(item)
    order = sorted(enumerate(by_file), key=lambda pair: (-seconds.get(pair[1], UNKNOWN_FILE_S), pair[0]))
    return [item for _, name in order for item in by_file[name]]


class FileSeconds:
    """Sums each file's setup, call and teardown seconds from the reports (the controller sees every worker's)."""

    def __init__(self, target: Path):
        self.target = target
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def write(self) -> None:
        rounded = {name: round(s, 1) for name, s in sorted(self.seconds.items(), key=lambda kv: -kv[1])}
        self.target.write_text(json.dumps(rounded, indent=1) + "\n")


def recorder() -> FileSeconds | None:
    """A recorder when ``$BATCH_PIPELINE_RECORD_FILE_SECONDS`` names where to write, on the controller only."""
    target = os.environ.get(RECORD_ENV)
    if not target or os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return FileSeconds(Path(target))
