"""Deploy pause and dead-letter replay, from the command line, on real runs against the sandbox."""

import json
import os
import time
from collections import Counter

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.cli import main
from batch_pipeline.core.ledger.attempts import AttemptLog
from batch_pipeline.core.ledger.control import JobControl
from batch_pipeline.core.ledger.result_parts import read_results
from batch_pipeline.core.publish.tables import JobState
from batch_pipeline.core.store import Store
from batch_pipeline.defs.jobs import build_jobs
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.defs.sensors import build_shard_sensor

ONLINE = {"name": "online", "settings": {"sandbox": True, "concurrency": 2, "flush_every": 2}}


def _billed_online(sandbox) -> list[str]:
    return [e["completion_id"] for e in sandbox.ledger() if e["mode"] == "online"]


def _completion_ids(store: Store, job: str) -> pl.Series:
    results = read_results(store, job, columns=["request_id", "raw_payload"])
    return results["raw_payload"].map_elements(lambda p: json.loads(p)["id"], return_dtype=pl.String)


@pytest.mark.timeout(900)  # its own deadlines (start, stop, re-run) add up past the 300 s default
def test_pause_mid_shard_then_resume_sends_nothing_twice(cli, sandbox, sandbox_proc, make_job, home, tmp_path, capsys):
    spec = make_job(backend=ONLINE, canary_first=False, shards={"max_requests": 20})
    _, url = sandbox_proc
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    store = Store(home)
    sandbox.set_scenario("normal", rpm=60)  # about one online request a second: the shard is caught mid-way
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "BATCH_PIPELINE_SANDBOX_URL": url}
    proc = cli.popen(["run", spec.source_path, "--home", str(home)], env=env, stderr_to_stdout=True)
    try:
        deadline = time.monotonic() + 300  # a subprocess start and the dagster import took over 90 s under load
        while len(_billed_online(sandbox)) < 3:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the run never billed an online request"
            time.sleep(0.1)
        assert main(["pause", spec.source_path, "--home", str(home), "--reason", "deploy"]) == 0
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3 and "paused" in out and "Traceback" not in out, out
    billed = _billed_online(sandbox)
    assert 3 <= len(billed) < 40
    assert set(_completion_ids(store, spec.name)) == set(billed)  # every paid answer was stored before returning
    [attempt] = AttemptLog(store, spec.name, "s00001").all()
    assert attempt.abandoned.reason.startswith("paused")  # the lease and the shard were given back
    # while paused, the shard driver launches nothing
    with dg.DagsterInstance.ephemeral() as instance:
        from batch_pipeline.defs.resources import PricesResource, StoreResource

        resources = {
            "store": StoreResource(root=str(home)),
            "prices": PricesResource(path=str(spec.input_base_dir() / "x")),
        }
        tick = build_shard_sensor(spec, build_jobs(spec))(
            dg.build_sensor_context(instance=instance, resources=resources)
        )
        assert isinstance(tick, dg.SkipReason) and "paused" in tick.skip_message
    # resume: the rest goes out once
    sandbox.set_scenario("normal")
    again = cli.run(["resume", spec.source_path, "--home", str(home)], env=env, timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "was paused" in again.stdout
    billed = _billed_online(sandbox)
    assert len(billed) == 40 and len(set(billed)) == 40
    assert Counter(e["request_key"] for e in sandbox.ledger()).most_common(1)[0][1] == 1  # no request twice
    assert JobState.load(spec, store).check().valid == 40
    assert JobControl(store, spec.name).paused() is None


SUMMARY = {
    "type": "object",
    "properties": {"summary": {"type": "string"}},
    "required": ["summary"],
    "additionalProperties": False,
}


def test_replay_with_room_to_answer_turns_truncated_dead_letters_into_answers(
    sandbox, make_job, instance, resources, home, capsys
):
    # the sandbox answers with the first six words of the message: a one-word ticket fits in 10 tokens, a long
    # one is cut off (finish_reason length) and dead-lettered after its retry
    rows = [
        {"ticket_id": f"T{i}", "subject": "s", "body": f"word{i}" if i % 2 else f"a long ticket body number {i}"}
        for i in range(20)
    ]
    spec = make_job(
        rows=rows,
        prompt={"version": "v1", "system": "Summarise.", "template": "{body}"},
        output={"json_schema": SUMMARY},
        sampling={"temperature": 0, "max_tokens": 10},
        canary={"max_failure_rate": 1.0},
        retries={"spend_cap_share": 1.0},
    )
    report = run_job(spec, instance, resources)
    assert report["succeeded"] == 10 and report["dead_lettered"] == 10
    store = Store(home)
    dead = JobState.load(spec, store).states.filter(pl.col("state") == "dead_lettered")
    assert set(dead["last_error_code"]) == {"truncated"} and set(dead["failures"]) == {2}
    billed_before = len(sandbox.ledger())
    # a replay that matches nothing says so and changes nothing
    assert main(["replay", spec.source_path, "--home", str(home), "--code", "context_length_exceeded"]) == 2
    assert "no dead letters match" in capsys.readouterr().out
    assert main(["replay", spec.source_path, "--home", str(home), "--code", "truncated", "--max-tokens", "64"]) == 0
    assert "10 dead letter(s)" in capsys.readouterr().out
    report = run_job(spec, instance, resources)
    assert report["complete"] and report["succeeded"] == 20 and report["dead_lettered"] == 0
    # only the ten replayed items were sent again, once each; the ten answers that fitted were kept
    replayed = sandbox.ledger()[billed_before:]
    assert sorted(e["custom_id"] for e in replayed) == sorted(dead["request_id"])
    assert [r["items"] for r in report["replays"]] == [10] and report["replays"][0]["max_tokens"] == 64
    attempts = AttemptLog(store, spec.name, "s00001").all()
    assert len(attempts[-1].request_ids) <= 10
