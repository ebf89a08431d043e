"""The same job with its store on S3 (a moto server on loopback) gives the same results as on local disk."""

import os
import socket
import subprocess
import sys
import time
import urllib.request

import boto3
import polars as pl
import pytest

from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline.defs.pipeline import run_job
from batch_pipeline.defs.resources import PricesResource, StoreResource

from .conftest import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def moto_url():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def s3_root(moto_url, monkeypatch) -> str:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    boto3.client("s3", endpoint_url=moto_url).create_bucket(Bucket="batch-results")
    host = moto_url.removeprefix("http://")
    return f"s3://batch-results/prefix?endpoint_override={host}&scheme=http&region=us-east-1"


def test_job_on_s3_store_matches_local_disk(sandbox, moto_url, s3_root, make_job, instance, tmp_path):
    spec = make_job()
    prices = PricesResource(path=str(REPO / "data" / "prices.yaml"))
    s3_report = run_job(spec, instance, {"store": StoreResource(root=s3_root), "prices": prices})
    listing = boto3.client("s3", endpoint_url=moto_url).list_objects_v2(Bucket="batch-results")
    keys = [o["Key"] for o in listing["Contents"]]
    assert any(k.startswith("prefix/jobs/t/results/") for k in keys)
    assert any(k.endswith("validated/t.parquet") for k in keys)
    sandbox.reset()
    import dagster as dg

    with dg.DagsterInstance.ephemeral() as local_instance:
        local_report = run_job(
            spec, local_instance, {"store": StoreResource(root=str(tmp_path / "local")), "prices": prices}
        )
    for key in ("unique_requests", "succeeded", "input_tokens", "output_tokens", "cost_usd", "complete"):
        assert s3_report[key] == local_report[key], key
    s3_table = pl.read_parquet(Store(s3_root).read_bytes(JobPaths("t").validated))
    local_table = pl.read_parquet(Store(tmp_path / "local").read_bytes(JobPaths("t").validated))
    cols = ["source_key", "request_id", "output", "input_tokens", "output_tokens"]
    assert s3_table.select(cols).sort("source_key").equals(local_table.select(cols).sort("source_key"))
    assert os.environ["AWS_ACCESS_KEY_ID"] not in str(s3_report)


def test_new_data_sensor_watches_an_s3_prefix(moto_url, s3_root, make_job, instance, home):
    from batch_pipeline.defs.jobs import build_jobs
    from batch_pipeline.defs.sensors import build_new_data_sensor

    s3 = boto3.client("s3", endpoint_url=moto_url)
    s3.create_bucket(Bucket="landing")
    body = (REPO / "data" / "samples" / "tickets_small" / "tickets.jsonl").read_bytes()
    s3.put_object(Bucket="landing", Key="tickets/day1.jsonl", Body=body)
    host = moto_url.removeprefix("http://")
    spec = make_job(
        input={
            "path": f"s3://landing/tickets/*.jsonl?endpoint_override={host}&scheme=http",
            "text_field": "body",
            "key_field": "ticket_id",
        }
    )
    sensor = build_new_data_sensor(spec, build_jobs(spec))
    ctx = dg_context(instance)
    first = sensor(ctx)
    assert first.run_key.startswith("prepare:")
    assert sensor(dg_context(instance, ctx.cursor)).__class__.__name__ == "SkipReason"
    s3.put_object(Bucket="landing", Key="tickets/day2.jsonl", Body=body)
    second = sensor(dg_context(instance, ctx.cursor))
    assert second.run_key.startswith("prepare:") and second.run_key != first.run_key
    # the manifest reads the objects through the same URI
    from batch_pipeline.core.manifest.shards import build_manifest

    summary = build_manifest(spec, Store(home))
    assert summary.input_files == 2 and summary.accepted_rows == 80 and summary.new_requests == 40


def dg_context(instance, cursor=None):
    import dagster as dg

    return dg.build_sensor_context(instance=instance, cursor=cursor)


def test_two_concurrent_lease_attempts_on_s3_one_wins(s3_root):
    """The lease is a conditional PUT on S3: of two contenders racing for the same token, exactly one wins."""
    import threading

    from batch_pipeline.core.run.lease import LeaseHeldError, acquire

    store = Store(s3_root)
    start = threading.Barrier(8)
    won, lost = [], []

    def contend(i: int) -> None:
        start.wait()
        try:
            won.append(acquire(store, "race", "s00001", owner=f"remote-host:{i}:x"))
        except LeaseHeldError:
            lost.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 7 and won[0].token == 1
    assert store.create_json_exclusive("jobs/t/x.json", {"a": 1}) is True
    assert store.create_json_exclusive("jobs/t/x.json", {"a": 2}) is False
