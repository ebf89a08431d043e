"""``batch-pipeline run`` with the engine core in its own processes (``multiprocessing: true``) exits when the job is
done, and leaves none of the engine's processes behind.

Before the executor shut its engine down at exit, such a run printed its summary and then waited forever:
multiprocessing's exit hook joins the non-daemon engine core process, which vLLM only stops in a finalizer that
runs later.
"""

import os
import subprocess

import psutil

from .conftest import PY, engine_settings, processes_left, python_env, stop_process, write_job


def _session(sid: int) -> list[psutil.Process]:
    members = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                members.append(p)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return members


def test_a_run_with_the_engine_in_its_own_processes_exits_and_leaves_none_behind(tmp_path, tiny_model, prices_file):
    backend = {"name": "vllm", "settings": engine_settings(tiny_model, multiprocessing=True)}
    spec = write_job(tmp_path, "vmpexit", backend, canary_first=False)
    env = python_env(DAGSTER_HOME=str(tmp_path / "dagster_home"), BATCH_PIPELINE_PRICES=str(prices_file))
    proc = subprocess.Popen(
        [PY, "-m", "batch_pipeline.cli", "run", spec.source_path, "--home", str(tmp_path / "home")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the engine core and its worker join this session
    )
    try:
        out, _ = proc.communicate(timeout=500)  # a hang at exit fails here, not by its duration
        # checked before anything is killed: what is still in the session once the run has exited
        left = processes_left(_session(proc.pid))
    finally:
        stop_process(proc, family=_session(proc.pid))
    assert proc.returncode == 0, out[-3000:]
    assert "succeeded" in out
    assert left == [], f"engine processes outlived the run: {left}"
