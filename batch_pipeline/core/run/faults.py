"""Named crash points for the fault campaign: ``BATCH_PIPELINE_CRASH_AT=<point>`` SIGKILLs the process there.

A real kill at a real boundary (no mock): the test starts ``batch-pipeline run`` with the variable set, the
process dies at that exact moment with nothing flushed or cleaned up, and the next run must finish the job
without paying for anything twice. ``BATCH_PIPELINE_CRASH_AFTER=N`` lets the point pass N-1 times first.
Unset (always, outside tests), a crash point is one dictionary lookup.
"""

import os
import signal

POINTS = (
    "after_intent",
    "after_create",
    "mid_collect",
    "before_collected",
    "after_collected",
    "mid_stream",
    "before_discard",
    "mid_rescue",
    "after_reserve",
)
_seen: dict[str, int] = {}


def crash_point(name: str) -> None:
    assert name in POINTS, name
    if os.environ.get("BATCH_PIPELINE_CRASH_AT") != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] >= int(os.environ.get("BATCH_PIPELINE_CRASH_AFTER", "1")):
        os.kill(os.getpid(), signal.SIGKILL)


def faults_armed() -> bool:
    return "BATCH_PIPELINE_CRASH_AT" in os.environ
