"""What the UI shows of a job: dollars as dollars, column schemas on the tables, descriptions that say what a
failure means, and the spec's owners and tags on every asset and job."""

import dagster as dg
import polars as pl
import pyarrow as pa
import pytest

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.money.quote import quote_components
from batch_pipeline.core.pricing.cost import load_prices
from batch_pipeline.core.pricing.usd import format_usd
from batch_pipeline.defs.assets import asset_key
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.metadata import column_schema, md_table, money_json, plain
from batch_pipeline.defs.pipeline import run_job

from .conftest import REPO


@pytest.mark.parametrize(
    "amount,shown",
    [
        (0, "$0.00"),
        (0.037884, "$0.0379"),
        (1.9274999999e-05, "$0.0000193"),
        (0.5, "$0.50"),
        (12.3, "$12.30"),
        (1234.5, "$1,234.50"),
        (-0.0021, "-$0.0021"),
        (5, "$5.00"),
        (5.2e-06, "$0.0000052"),
        (2.2424999e-05, "$0.0000224"),
        (0.01, "$0.01"),
        (0.9996, "$1.00"),
    ],
)
def test_dollars_read_as_dollars(amount, shown):
    assert format_usd(amount) == shown


def test_plain_keeps_dollars_numeric_with_their_text_beside_and_keeps_other_numbers():
    meta = plain({"cost_usd": 1.9274999999e-05, "budget_usd": 5, "rows": 40, "calibration": 1.25, "gone": None})
    # a number, so the asset's Plots tab draws it over time; the dollars a person reads right after it
    assert meta["cost_usd"] == dg.MetadataValue.float(1.9274999999e-05)
    assert meta["cost_usd_text"] == dg.MetadataValue.text("$0.0000193")
    assert meta["budget_usd"] == dg.MetadataValue.float(5.0) and meta["budget_usd_text"].value == "$5.00"
    assert list(meta)[:4] == ["cost_usd", "cost_usd_text", "budget_usd", "budget_usd_text"]
    assert meta["rows"] == dg.MetadataValue.int(40) and meta["calibration"] == dg.MetadataValue.float(1.25)
    assert "gone" not in meta


def test_preview_and_json_amounts_are_dollars():
    frame = pl.DataFrame({"source_key": ["a"], "cost_usd": [1.9274999999e-05], "share": [0.30000000000000004]})
    text = md_table(frame).value
    assert "| a | $0.0000193 | 0.3 |" in text and "e-05" not in text
    assert money_json({"batch": 0.037884}, money=True) == {"batch": "$0.0379"}
    nested = money_json(
        {"quoted_usd": {"low": 0.01}, "first_pass": {"actual": 0.02}, "input_tokens": {"actual": 7}},
        money_keys=("first_pass",),
    )
    assert nested == {"quoted_usd": {"low": "$0.01"}, "first_pass": {"actual": "$0.02"}, "input_tokens": {"actual": 7}}


def test_column_schema_from_arrow_and_polars():
    arrow = column_schema(pa.schema([("request_id", pa.string()), ("cost_usd", pa.float64())]))
    assert [(c.name, c.type) for c in arrow.columns] == [("request_id", "string"), ("cost_usd", "double")]
    assert "USD" in arrow.columns[1].description
    polars = column_schema(pl.Schema({"failures": pl.UInt32, "odd": pl.String}))
    assert [(c.name, c.type, c.description is None) for c in polars.columns] == [
        ("failures", "UInt32", False),
        ("odd", "String", True),
    ]


@pytest.mark.parametrize(
    "field,value",
    [("owners", ["not an owner"]), ("owners", ["team:"]), ("tags", {"bad key!": "x"}), ("tags", {"team": "x" * 64})],
)
def test_bad_owners_and_tags_are_config_errors_naming_the_field(make_job, field, value):
    with pytest.raises(ConfigError, match=field):
        make_job(**{field: value})


def _latest(instance, key: dg.AssetKey) -> dict:
    event = instance.get_latest_materialization_event(key)
    assert event is not None, key
    return event.asset_materialization.metadata


def test_a_run_shows_dollars_column_schemas_descriptions_owners_and_tags(sandbox, make_job, instance, resources):
    owners, tags = ["data-eng@example.com", "team:labelling"], {"domain": "support", "cost-center": "cc-42"}
    spec = make_job(owners=owners, tags=tags)
    run_job(spec, instance, resources)
    defs = build_definitions([spec], resources)

    # every cost and count stays a number (the Plots tab draws it), its dollars as text beside it
    report = _latest(instance, asset_key(spec, "report"))
    for key in ("cost_usd", "cost_per_accepted_item_usd"):
        assert isinstance(report[key], dg.FloatMetadataValue) and report[key].value > 0, key
        assert report[f"{key}_text"].value == format_usd(report[key].value), key
    for key in ("succeeded", "input_rows", "unique_requests", "requests_sent", "input_tokens"):
        assert isinstance(report[key], dg.IntMetadataValue), key
    assert all(v.startswith("$") for v in report["cost_by_pricing"].value.values())
    results = _latest(instance, asset_key(spec, "results"))
    preview = results["preview"].value
    assert "$0.0" in preview and "e-0" not in preview
    quote = _latest(instance, asset_key(spec, "quote"))
    assert isinstance(quote["cost_high_usd"], dg.FloatMetadataValue)
    assert quote["cost_high_usd_text"].value.startswith("$")
    assert quote["budget_usd"].value == 5.0 and quote["budget_usd_text"].value == "$5.00"
    assert isinstance(quote["pending_requests"], dg.IntMetadataValue)
    passes = quote["passes"].value  # the passes' amounts as dollars, not 2.2424999e-05
    assert passes["first"]["cost_expected"].startswith("$") and isinstance(passes["first"]["requests"], int)
    assert "e-0" not in str(passes)

    # column schemas: the staged and validated tables (from the Parquet file) and the dead letters
    for name, expected in [
        ("results", {"request_id": "String", "cost_usd": "Float64", "is_duplicate": "Boolean"}),
        ("validated", {"request_id": "string", "cost_usd": "double", "attempt": "int32"}),
        ("dead_letters", {"request_id": "String", "failures": "UInt32"}),
    ]:
        meta = _latest(instance, asset_key(spec, name))
        schema = meta["dagster/column_schema"].value
        types = {c.name: c.type for c in schema.columns}
        assert expected.items() <= types.items(), (name, types)
        assert all(c.description for c in schema.columns if c.name in expected), name
        assert meta["dagster/row_count"].value >= 0

    # owners and tags on every asset of the job, tags on every job
    job_assets = [a for a in defs.assets if any(k.path[0] == spec.name for k in a.keys)]
    assert job_assets
    for a in job_assets:
        for key in a.keys:
            assert list(a.owners_by_key[key]) == owners, key
            assert tags.items() <= a.tags_by_key[key].items(), key
    for job in defs.resolve_all_job_defs():
        if job.name.startswith(f"{spec.name}_"):
            assert tags.items() <= job.tags.items(), job.name

    # every asset and check says what it is and what a failure means
    for a in job_assets:
        for key in a.keys:
            assert len(a.descriptions_by_key.get(key) or "") > 40, key
    checks = [c for cd in defs.asset_checks for c in cd.check_specs]
    assert {c.name for c in checks} >= {"quote_within_budget", "no_truncated_outputs", "shard_distributions"}
    for c in checks:
        assert "Fails when" in (c.description or "") and "Fix:" in c.description, c.name
    truncated = next(c for c in checks if c.name == "no_truncated_outputs")
    assert f"batch-pipeline replay {spec.name} --code truncated" in truncated.description


def test_a_spec_without_owners_or_tags_labels_nothing(make_job):
    spec = make_job()
    defs = build_definitions([spec])
    manifest = next(a for a in defs.assets if asset_key(spec, "manifest") in a.keys)
    assert not list(manifest.owners_by_key[asset_key(spec, "manifest")])
    assert not [k for k in manifest.tags_by_key[asset_key(spec, "manifest")] if not k.startswith("dagster/")]


def test_owners_and_tags_are_not_part_of_the_quote_fingerprint(make_job):
    price = load_prices(REPO / "data" / "prices.yaml").lookup("openai_batch", "gpt-4o-mini")
    plain_spec = make_job()
    labelled = make_job(owners=["team:labelling"], tags={"domain": "support"})
    changed = make_job(retries={"per_item": 2})  # a fingerprinted field: the comparison can tell a change
    components = [quote_components(s, 0, price, None)["job spec"] for s in (plain_spec, labelled, changed)]
    assert components[0] == components[1] != components[2]
