"""Longest test files first, so that the xdist workers finish together, and the files that mostly wait one at a time.

`scripts/test.sh` runs `--dist loadfile --no-loadscope-reorder`: a file is the unit of work and the workers take
the files in collection order, one at a time as each frees. Left to itself xdist orders files by their number of
tests, which put the few-test `dagster dev` and kill files (a minute each) last: one worker ran them alone for
minutes at the end. Ordering by measured seconds (longest first) leaves only short files for the end.

Longest first also started the five longest files together, and all five mostly wait (on the sandbox's clock, on
sensor ticks, on `dagster dev`'s run workers): for their first ~170 s the three workers used a small part of the
two cores. Files marked ``waits`` are therefore handed out one at a time while other files remain, unless that would
make them end last: the order is a simulation of the workers taking files longest first (``_handed_out``).

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


def longest_files_first(
    items: list[pytest.Item], seconds: dict[str, float], waiting: set[str] | None = None, workers: int = 1
) -> list[pytest.Item]:
    """``items`` regrouped by file, the files longest first (ties: collection order), each file's tests in their
    collected order; with ``waiting`` files and several ``workers``, in the order ``_handed_out`` gives."""
    by_file: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_file[file_of(item.nodeid)].append(item)
    order = [name for _, name in sorted(enumerate(by_file), key=lambda p: (-seconds.get(p[1], UNKNOWN_FILE_S), p[0]))]
    if waiting and workers > 1:
        order = _handed_out(order, seconds, waiting, workers)
    return [item for name in order for item in by_file[name]]


def _handed_out(order: list[str], seconds: dict[str, float], waiting: set[str], workers: int) -> list[str]:
    """The files in the order ``workers`` take them: a free worker takes the longest file left, but a waiting file
    only when no other is running, or when the waiting files left, one after another from the end of the last one
    running, would end past the workers' even share of all the seconds (or when nothing else is left). Each file
    lasts its known seconds."""
    others = [f for f in order if f not in waiting]
    waits = [f for f in order if f in waiting]
    length = {f: seconds.get(f, UNKNOWN_FILE_S) for f in order}
    share = sum(length.values()) / workers
    free_at = [0.0] * workers
    waiting_ends: list[float] = []
    handed: list[str] = []
    while others or waits:
        worker = min(range(workers), key=free_at.__getitem__)
        now = free_at[worker]
        running = [end for end in waiting_ends if end > now]
        chain_end = max(running, default=now) + sum(length[f] for f in waits)
        if waits and (not running or chain_end > share or not others):
            name = waits.pop(0)
            waiting_ends.append(now + length[name])
        else:
            name = others.pop(0)
        free_at[worker] = now + length[name]
        handed.append(name)
    return handed


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
