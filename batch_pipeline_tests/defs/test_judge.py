"""Judge sampling for free-text outputs: stratified sample, graded through an executor, agreement vs golden."""

import json

import dagster as dg
import polars as pl
import pytest

from batch_pipeline.core.quality.judge import stratified_sample, summarise
from batch_pipeline.core.store import Store
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.evals import WEEKLY
from batch_pipeline.defs.pipeline import run_job

from .conftest import REPO

ONLINE = {"name": "online", "settings": {"sandbox": True}}


def test_stratified_sample_covers_every_stratum_in_proportion():
    rows = [
        {"request_id": f"r{i}", "shard_id": f"s{i % 4}", "length_bucket": 3 if i % 10 == 1 else 0} for i in range(400)
    ]
    sample = stratified_sample(pl.DataFrame(rows), 40)
    strata = sample.group_by("shard_id", "length_bucket").len()
    existing = pl.DataFrame(rows).group_by("shard_id", "length_bucket").len()
    assert strata.height == existing.height == 6 and sample.height <= 40
    assert sample["length_bucket"].eq(3).sum() >= 4  # the rare long bucket is still represented
    assert stratified_sample(pl.DataFrame(rows), 40).equals(sample)  # reproducible


def test_summary_counts_passes_and_agreement_over_judged_rows_only():
    """7 passes in 10 judged (2 unjudged); the judge agrees with the golden truth on 8 of those 10."""
    graded = pl.DataFrame(
        {"request_id": [f"r{i}" for i in range(12)], "verdict": ["pass"] * 7 + ["fail"] * 3 + [None, None]}
    )
    truth = pl.DataFrame(
        {"request_id": [f"r{i}" for i in range(12)], "correct": [True] * 5 + [False] * 2 + [False] * 3 + [True, True]}
    )
    summary = summarise(graded, truth)
    assert (summary["sampled"], summary["judged"], summary["golden_judged"]) == (12, 10, 10)
    assert summary["pass_rate"] == 0.7 and summary["agreement"] == 0.8
    # the 95% Wilson intervals of 7/10 and 8/10
    assert summary["pass_rate_low"] == pytest.approx(0.3968, abs=1e-4)
    assert summary["pass_rate_high"] == pytest.approx(0.8922, abs=1e-4)
    assert (summary["agreement_low"], summary["agreement_high"]) == pytest.approx((0.4902, 0.9433), abs=1e-4)


def test_judge_asset_grades_a_sample_and_reports_agreement_with_golden(sandbox, make_job, instance, resources, home):
    quality = {
        "golden": str(REPO / "data" / "golden" / "demo.jsonl"),
        "golden_share": 0.1,
        "eval_backend": ONLINE,
        "canary_min_accuracy": 0.0,
        "judge": {"backend": ONLINE, "sample_size": 12},
    }
    spec = make_job(
        output={"text": {}},
        sampling={"temperature": 0, "max_tokens": 64},
        quality=quality,
        canary={"max_failure_rate": 1.0},
    )
    run_job(spec, instance, resources)
    defs = build_definitions([spec], resources)
    result = dg.materialize(
        [*defs.assets],
        selection=[dg.AssetKey([spec.name, "judge"])],
        instance=instance,
        resources=defs.resources,
        partition_key=WEEKLY.get_first_partition_key(),
    )
    assert result.success
    summary = Store(home).read_json(f"jobs/{spec.name}/judge.json")
    assert summary["sampled"] == summary["judged"] == 12
    verdicts = pl.read_parquet(Store(home).read_bytes(f"jobs/{spec.name}/judge/verdicts.parquet"))
    assert set(verdicts["verdict"].drop_nulls()) <= {"pass", "fail"}
    st = Store(home)
    probes = pl.concat(
        [pl.read_parquet(st.read_bytes(p)) for p in st.list_files(f"jobs/{spec.name}/golden/probes", suffix=".parquet")]
    )
    assert verdicts.height == 12 + summary["golden_judged"]  # the sample, then the golden probes as a yardstick
    judged = verdicts.join(probes.select("request_id"), on="request_id", how="anti").filter(
        pl.col("verdict").is_not_null()
    )
    assert judged.height == 12  # every sampled answer got a verdict from the sandbox's judge
    # the stored figures are the verdicts' own: recomputed here from the table the asset wrote
    assert summary["pass_rate"] == pytest.approx(float((judged["verdict"] == "pass").mean()))
    probe_ids = set(probes["request_id"])
    assert (
        summary["golden_judged"]
        == verdicts.filter(pl.col("request_id").is_in(probe_ids) & pl.col("verdict").is_not_null()).height
        > 0
    )
    judged_online = [e for e in sandbox.ledger() if e.get("mode") == "online"]
    assert len(judged_online) == verdicts.height


def _ticket(i: int, subject: str, body: str, **extra) -> dict:
    return {"ticket_id": f"T{i:06d}", "subject": subject, "body": body, **extra}


# The sandbox answers an enum with the first [[sandbox:label=X]] marker naming one of its values: the first marker
# steers the job's label (and so whether a golden probe is right), the second the judge's verdict on it.
GOLDEN = [  # (label the job gives, the golden label, the judge's verdict): agreement on exactly 3 of 4
    ("billing", "billing", "pass"),  # right, judged pass: agrees
    ("billing", "billing", "fail"),  # right, judged fail: disagrees
    ("bug", "billing", "fail"),  # wrong, judged fail: agrees
    ("bug", "account", "fail"),  # wrong, judged fail: agrees
]
VERDICTS = ["pass"] * 6 + ["fail"] * 2  # the job's own 8 rows: pass rate exactly 6 of 8


def test_the_eval_job_runs_the_judge_and_its_agreement_with_golden_is_exactly_three_of_four(
    sandbox, make_job, instance, resources, home, tmp_path
):
    golden = tmp_path / "golden.jsonl"
    golden.write_text(
        "".join(
            json.dumps(
                _ticket(
                    900 + i,
                    f"Golden ticket {i}",
                    f"Case {i}. [[sandbox:label={given}]] [[sandbox:label={verdict}]]",
                    label=label,
                )
            )
            + "\n"
            for i, (given, label, verdict) in enumerate(GOLDEN)
        )
    )
    rows = [_ticket(i, f"Ticket {i}", f"Question number {i}. [[sandbox:label={v}]]") for i, v in enumerate(VERDICTS)]
    quality = {
        "golden": str(golden),
        "golden_share": 0.5,
        "eval_backend": ONLINE,
        "canary_min_accuracy": 0.0,
        "judge": {"backend": ONLINE, "sample_size": 8},
    }
    spec = make_job(rows=rows, quality=quality)
    report = run_job(spec, instance, resources)
    assert report["succeeded"] == 8

    defs = build_definitions([spec], resources)
    eval_job = defs.resolve_job_def(f"{spec.name}_eval")
    assert dg.AssetKey([spec.name, "judge"]) in eval_job.asset_layer.executable_asset_keys
    schedule = defs.resolve_schedule_def(f"{spec.name}_weekly_eval")
    assert schedule.job_name == eval_job.name
    week = WEEKLY.get_first_partition_key()
    before = len(sandbox.ledger())
    result = eval_job.execute_in_process(instance=instance, partition_key=week)
    assert result.success

    summary = Store(home).read_json(f"jobs/{spec.name}/judge.json")
    assert summary["week"] == week
    assert (summary["sampled"], summary["judged"], summary["pass_rate"]) == (8, 8, 0.75)
    assert (summary["golden_judged"], summary["agreement"]) == (4, 0.75)
    verdicts = pl.read_parquet(Store(home).read_bytes(f"jobs/{spec.name}/judge/verdicts.parquet"))
    assert sorted(verdicts["verdict"].to_list()) == sorted(VERDICTS + [v for _, _, v in GOLDEN])
    # the weekly eval in the same run: the job's labels are right on exactly 2 of the 4 golden records
    eval_meta = instance.get_latest_materialization_event(dg.AssetKey([spec.name, "eval"])).asset_materialization
    assert eval_meta.partition == week and eval_meta.metadata["accuracy"].value == 0.5
    judge_meta = instance.get_latest_materialization_event(dg.AssetKey([spec.name, "judge"])).asset_materialization
    assert judge_meta.partition == week and judge_meta.metadata["agreement"].value == 0.75
    # one online request per golden record (the eval) and per graded answer (the judge), nothing else
    assert len(sandbox.ledger()) - before == len(GOLDEN) + len(VERDICTS) + len(GOLDEN)
