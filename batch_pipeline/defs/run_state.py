"""One JobState per publish run: its ``results`` step reads it after its sweep, and what runs after it in the same
run and process (the blocking checks, ``dead_letters``, ``report``) reads the same results, so it takes that scan
instead of scanning every result part again (three scans of a 1M-item job's parts were one)."""

import dagster as dg

from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.store import Store

# by (run, job, store): only the latest run's, until the report (the run's last step) lets it go
_RUN_STATE: dict[tuple[str, str, str], JobState] = {}


def run_state(
    context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext, spec: JobSpec, st: Store, fresh: bool = False
) -> JobState:
    """This run's JobState of the job: ``fresh`` (the results step) reads it anew; a later step of the same run takes
    that one, else (another process, a run without the results step) reads its own."""
    key = (context.run.run_id, spec.name, str(st.root))
    state = None if fresh else _RUN_STATE.get(key)
    if state is None:
        state = JobState.load(spec, st)
        _RUN_STATE.clear()
        _RUN_STATE[key] = state
    return state


def release() -> None:
    """The run's last reader is done: a long-lived process does not hold the job's frames."""
    _RUN_STATE.clear()
