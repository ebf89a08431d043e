"""``batch-pipeline run`` with the engine core in its own processes (``multiprocessing: true``) exits when the job is
done, and leaves none of the engine's processes behind; with the engine in its own process, it exits without
tearing the engine down.

Before the executor shut its engine down at exit, such a run printed its summary and then waited forever:
multiprocessing's exit hook joins the non-daemon engine core process, which vLLM only stops in a finalizer that
runs later. An engine in the run's own process was torn down at exit by that finalizer (a full ``gc.collect``, the
KV cache released): 3-5 s after the summary, for memory the exit frees anyway.
"""

import os
import subprocess

import psutil

from .conftest import PY, engine_settings, processes_left, python_env, stop_process, write_job

TEARDOWN = "[shutdown] EngineCore: tearing down local resources"  # vLLM's debug line as its engine shuts down


def _session(sid: int) -> list[psutil.Process]:
    members = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                members.append(p)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return members


def _run_argv(spec, tmp_path) -> list[str]:
    """``batch-pipeline run`` of ``spec`` with its home under ``tmp_path``."""
    return [PY, "-m", "batch_pipeline.cli", "run", spec.source_path, "--home", str(tmp_path / "home")]


def test_a_run_with_the_engine_in_its_own_processes_exits_and_leaves_none_behind(tmp_path, tiny_model, prices_file):
    backend = {"name": "vllm", "settings": engine_settings(tiny_model, multiprocessing=True)}
    spec = write_job(tmp_path, "vmpexit", backend, canary_first=False)
    env = python_env(DAGSTER_HOME=str(tmp_path / "dagster_home"), BATCH_PIPELINE_PRICES=str(prices_file))
    proc = subprocess.Popen(
        _run_argv(spec, tmp_path),
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


def test_a_run_with_the_engine_in_process_exits_without_tearing_the_engine_down(tmp_path, tiny_model, prices_file):
    backend = {"name": "vllm", "settings": engine_settings(tiny_model)}  # multiprocessing false
    spec = write_job(tmp_path, "vinexit", backend, canary_first=False)
    env = python_env(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        BATCH_PIPELINE_PRICES=str(prices_file),
        VLLM_LOGGING_LEVEL="DEBUG",  # vLLM logs its shutdown steps at debug
    )
    run = subprocess.run(
        _run_argv(spec, tmp_path),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=500,
    )
    out = run.stdout
    assert run.returncode == 0, out[-3000:]
    assert "Initializing a V1 LLM engine" in out and "validated table" in out, out[-3000:]
    assert TEARDOWN not in out, "the engine in the run's own process was torn down at exit"
