"""``batch-pipeline sandbox`` takes every flag of ``python -m batch_pipeline.sandbox`` and passes it through, plus
a repeatable ``--param KEY=VALUE`` coerced as scenario params are; a bad param stops it with an error."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from batch_pipeline.cli import main as cli_main
from batch_pipeline.sandbox import SandboxAdmin
from batch_pipeline.sandbox.__main__ import main as sandbox_main
from batch_pipeline.sandbox.process import READY_PREFIX, stop_sandbox_process

REPO = Path(__file__).resolve().parents[2]


def help_flags(main: Callable[[list[str]], Any], argv: list[str], capsys: pytest.CaptureFixture[str]) -> set[str]:
    """The long options a command's ``--help`` lists (run in this process)."""
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", capsys.readouterr().out))


def test_the_cli_offers_every_flag_of_the_sandbox_module(capsys):
    module = help_flags(sandbox_main, [], capsys)
    assert {
        "--port",
        "--host",
        "--state-dir",
        "--scenario",
        "--scenario-params",
        "--param",
        "--verbose",
        "--s3-url",
    } <= module
    assert module <= help_flags(cli_main, ["sandbox"], capsys)


def start_cli(*args: str, state_dir: Path) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCH_PIPELINE_SANDBOX_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "batch_pipeline.cli", "sandbox", "--port", "0", *args, "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the READY line, or EOF when it exits
    if not line.startswith(READY_PREFIX):
        stop_sandbox_process(proc)
        raise AssertionError(f"no READY line: {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}")
    return proc, line[len(READY_PREFIX) :].strip()


def test_params_and_flags_reach_the_sandbox(tmp_path):
    proc, url = start_cli(
        "--host",
        "localhost",
        "--scenario",
        "slow",
        "--scenario-params",
        '{"in_progress_s": 2}',
        "--param",
        "quota_enqueued_tokens=2000000",
        "--param",
        "retention_openai_s=60",
        "--param",
        "in_progress_s=5",
        "--verbose",
        state_dir=tmp_path,
    )
    try:
        assert url.startswith("http://127.0.0.1:")  # localhost is served on the loopback address
        SandboxAdmin(url).clock(freeze=True)  # a change: written to the state directory
        with urllib.request.urlopen(url + "/_sandbox/scenario", timeout=10) as response:
            current = json.loads(response.read())
        assert current["name"] == "slow"
        params = current["params"]
        assert params["quota_enqueued_tokens"] == 2000000 and isinstance(params["quota_enqueued_tokens"], int)
        assert params["retention_openai_s"] == 60 and params["in_progress_s"] == 5  # --param over --scenario-params
        assert (tmp_path / "state.json").exists()  # --state-dir reached it
    finally:
        assert stop_sandbox_process(proc) == 0
        assert proc.stderr is not None and "GET /_sandbox/scenario" in proc.stderr.read()  # --verbose reached it


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--param", "quota_enqueued_tokens=lots"], "quota_enqueued_tokens must be a number"),
        (["--param", "quota_concurrent_jobs=-1"], "quota_concurrent_jobs must be a whole number"),
        (["--param", "no_such_param=1"], "unknown params"),
        (["--param", "missing-equals"], "expected KEY=VALUE"),
        (["--host", "0.0.0.0"], "127.0.0.1"),  # --host reaches the sandbox, which refuses anything but loopback
    ],
)
def test_a_bad_flag_stops_it_with_an_error(args, says, capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["sandbox", "--port", "0", *args])  # the sandbox's parser refuses it before anything listens
    captured = capsys.readouterr()
    assert done.value.code == 2 and says in captured.err and "READY" not in captured.out
