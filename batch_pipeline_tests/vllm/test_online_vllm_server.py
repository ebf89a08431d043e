"""The online executor against a real vLLM OpenAI-compatible server on loopback (started here, stopped by PID).

Two ways to carry the output contract: the executor's default ``response_format`` (a JSON schema, which vLLM
turns into structured outputs; a choice comes back as ``{"label": ...}``), and vLLM's own
``structured_outputs`` through ``extra_body`` (with ``response_format: null``, since vLLM merges the two and
refuses a request with two constraints), which returns the bare label.
"""

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import jsonschema
import polars as pl
import psutil
import pytest

from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job

from .conftest import (
    JSON_SCHEMA,
    LABELS,
    MODEL,
    PY,
    family_of,
    free_port,
    processes_left,
    python_env,
    stop_process,
    write_job,
)

STARTUP_TIMEOUT_S = 240


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def vllm_server(tiny_model, tmp_path_factory) -> Iterator[str]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-server") / "server.log"
    argv = [
        PY,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_model),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "1024",
        "--kv-cache-memory-bytes",
        str(256 * 2**20),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--distributed-executor-backend",
        "uni",
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
    ]
    env = python_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    family: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"vLLM server did not come up (exit {proc.poll()}):\n" + log_path.read_text()[-4000:]
                )
            time.sleep(0.5)
        yield url
    finally:
        try:
            family = family_of(proc.pid)  # the server and every process it runs now
        except psutil.NoSuchProcess:
            pass
        stop_process(proc, family=family)
        survivors = processes_left(family)
        assert survivors == [], f"server processes left after stopping it by PID: {survivors}"


def _online(url: str, **extra) -> dict:
    return {
        "name": "online",
        "settings": {"base_url": f"{url}/v1", "api_key_env": None, "concurrency": 4, "flush_every": 8, **extra},
    }


def test_choice_job_through_the_server_with_response_format(vllm_server, tmp_path, instance, resources, home):
    spec = write_job(tmp_path, "vonline", _online(vllm_server))
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40 and report["invalid"] == 0
    table = pl.read_parquet(Store(home).local_path(JobPaths("vonline").validated))
    assert table.height == 40 and set(table["output"]) <= set(LABELS)
    assert all(json.loads(t)["label"] in LABELS for t in table["output_text"])  # {"label": ...} via the schema
    assert set(table["backend"]) == {"online"}


def test_choice_job_with_vllm_structured_outputs_in_extra_body(vllm_server, tmp_path, instance, resources, home):
    extra = {"response_format": None, "structured_outputs": {"choice": LABELS}}
    spec = write_job(tmp_path, "vonline_so", _online(vllm_server, extra_body=extra))
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    table = pl.read_parquet(Store(home).local_path(JobPaths("vonline_so").validated))
    assert set(table["output_text"]) <= set(LABELS)  # the bare label
    results = read_results(Store(home), "vonline_so")
    assert (results["cached_tokens"] > 0).sum() >= 30  # the server's prefix cache, reported in usage
    assert report["cached_tokens"] > 0


def test_json_schema_job_with_vllm_structured_outputs(vllm_server, tmp_path, instance, resources, home):
    extra = {"response_format": None, "structured_outputs": {"json": JSON_SCHEMA}}
    spec = write_job(
        tmp_path,
        "vonline_json",
        _online(vllm_server, extra_body=extra),
        output={"json_schema": JSON_SCHEMA},
        sampling={"temperature": 0, "max_tokens": 40},
    )
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 40
    table = pl.read_parquet(Store(home).local_path(JobPaths("vonline_json").validated))
    for text in table["output_text"]:
        jsonschema.validate(json.loads(text), JSON_SCHEMA)
