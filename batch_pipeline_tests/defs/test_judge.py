"""Judge sampling for free-text outputs: stratified sample, graded through an executor, agreement vs golden."""

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.quality.judge import stratified_sample, summarise
from batch_pipeline.core.store import Store
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.pipeline import run_job

from .conftest import REPO

ONLINE = {"name": "online", "settings": {"sandbox": True}}


def test_stratified_sample_covers_every_stratum_in_proportion():
    rows = [{"request_id": f"r{i}", "shard_id": f"s{i % 4}", "length_bucket": 3 if i % 10 == 1 else 0}
            for i in range(400)]
    sample = stratified_sample(pl.DataFrame(rows), 40)
    strata = sample.group_by("shard_id", "length_bucket").len()
    existing = pl.DataFrame(rows).group_by("shard_id", "length_bucket").len()
    assert strata.height == existing.height == 6 and sample.height <= 40
    assert sample["length_bucket"].eq(3).sum() >= 4  # the rare long bucket is still represented
    assert stratified_sample(pl.DataFrame(rows), 40).equals(sample)  # reproducible


def test_summary_counts_passes_and_agreement_over_judged_rows_only():
    """7 passes in 10 judged (2 unjudged); the judge agrees with the golden truth on 8 of those 10."""
    graded = pl.DataFrame({"request_id": [f"r{i}" for i in range(12)],
                           "verdict": ["pass"] * 7 + ["fail"] * 3 + [None, None]})
    truth = pl.DataFrame({"request_id": [f"r{i}" for i in range(12)],
                          "correct": [True] * 5 + [False] * 2 + [False] * 3 + [True, True]})
    summary = summarise(graded, truth)
    assert (summary["sampled"], summary["judged"], summary["golden_judged"]) == (12, 10, 10)
    assert summary["pass_rate"] == 0.7 and summary["agreement"] == 0.8
    # the 95% Wilson intervals of 7/10 and 8/10
    assert summary["pass_rate_low"] == pytest.approx(0.3968, abs=1e-4)
    assert summary["pass_rate_high"] == pytest.approx(0.8922, abs=1e-4)
    assert (summary["agreement_low"], summary["agreement_high"]) == pytest.approx((0.4902, 0.9433), abs=1e-4)


def test_judge_asset_grades_a_sample_and_reports_agreement_with_golden(sandbox, make_job, instance, resources,
                                                                       home):
    quality = {"golden": str(REPO / "data" / "golden" / "demo.jsonl"), "golden_share": 0.1,
               "eval_backend": ONLINE, "canary_min_accuracy": 0.0,
               "judge": {"backend": ONLINE, "sample_size": 12}}
    spec = make_job(output={"text": {}}, sampling={"temperature": 0, "max_tokens": 64}, quality=quality,
                    canary={"max_failure_rate": 1.0})
    run_job(spec, instance, resources)
    defs = build_definitions([spec], resources)
    result = dg.materialize([*defs.assets], selection=[dg.AssetKey([spec.name, "judge"])], instance=instance,
                            resources=defs.resources)
    assert result.success
    summary = Store(home).read_json(f"jobs/{spec.name}/judge.json")
    assert summary["sampled"] == summary["judged"] == 12
    verdicts = pl.read_parquet(Store(home).read_bytes(f"jobs/{spec.name}/judge/verdicts.parquet"))
    assert set(verdicts["verdict"].drop_nulls()) <= {"pass", "fail"}
    st = Store(home)
    probes = pl.concat([pl.read_parquet(st.read_bytes(p))
                        for p in st.list_files(f"jobs/{spec.name}/golden/probes", suffix=".parquet")])
    assert verdicts.height == 12 + summary["golden_judged"]  # the sample, then the golden probes as a yardstick
    judged = verdicts.join(probes.select("request_id"), on="request_id", how="anti") \
        .filter(pl.col("verdict").is_not_null())
    assert judged.height == 12  # every sampled answer got a verdict from the sandbox's judge
    # the stored figures are the verdicts' own: recomputed here from the table the asset wrote
    assert summary["pass_rate"] == pytest.approx(float((judged["verdict"] == "pass").mean()))
    assert summary["pass_rate_low"] < summary["pass_rate"] < summary["pass_rate_high"] or summary["pass_rate"] in (0, 1)
    assert summary["golden_judged"] >= 60 and summary["agreement_low"] <= summary["agreement"]
    judged_online = [e for e in sandbox.ledger() if e.get("mode") == "online"]
    assert len(judged_online) == verdicts.height
