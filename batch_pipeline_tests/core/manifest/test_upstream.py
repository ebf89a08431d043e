"""input.from_job: another job's validated table as input (filter, row identity, fields, request IDs)."""

import hashlib
import json

import polars as pl
import pyarrow as pa
import pytest

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.manifest import ids
from batch_pipeline.core.manifest.read import VALIDATED_SCHEMA
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.manifest.upstream import ShareSource, UpstreamTable, chain, checked_condition
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl, write_spec

TICKETS = [{"id": f"T{i}", "subject": f"subject {i}", "body": f"body  of ticket {i}"} for i in range(1, 7)]
LABELS = ["billing", "other", "bug", "other", "other", "billing"]


def publish_upstream(store: Store, source: str, labels: list[str], outputs: list[str] | None = None) -> None:
    """The upstream's validated table, as its publish writes it (one row per source row)."""
    n = len(labels)
    cols = {name: [None] * n for name in VALIDATED_SCHEMA.names}
    cols.update(
        source=[source] * n,
        line=list(range(1, n + 1)),
        source_key=[f"T{i}" for i in range(1, n + 1)],
        request_id=[hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)],
        output=outputs or labels,
        model=["m-1"] * n,
        is_duplicate=[False] * n,
        cost_usd=[0.001] * n,
    )
    store.write_table(JobPaths("up").validated, pa.table(cols, schema=VALIDATED_SCHEMA))


@pytest.fixture
def jobs(tmp_path):
    source = write_jsonl(tmp_path / "in" / "tickets.jsonl", TICKETS)
    up = write_spec(tmp_path / "jobs", base_spec_dict(str(source), name="up"), "up.yaml")

    def down(**inputs):
        spec = base_spec_dict(
            "",
            name="down",
            prompt={"version": "d1", "system": "Extract.", "template": "{output}: {subject}\n{body}"},
            output={"json_schema": {"type": "object", "properties": {"topic": {"type": "string"}}}},
            sampling={"temperature": 0, "max_tokens": 64},
        )
        spec["input"] = {"from_job": "up", "text_field": "body", **inputs}
        return write_spec(tmp_path / "jobs", spec, "down.yaml")

    return up, down, str(source)


def test_rows_keep_the_upstream_identity_fields_and_answer(jobs, tmp_path):
    _, down, source = jobs
    store = Store(tmp_path / "home")
    publish_upstream(store, source, LABELS)
    spec = down(where="output = 'other'")
    assert [s.name for s in chain(spec)] == ["up", "down"]
    summary = build_manifest(spec, store)
    assert summary.new_requests == 3 and summary.rejected_rows == 0
    rows = pl.from_arrow(Manifest("down", store).rows()).sort("line")
    assert rows["source"].to_list() == [source] * 3 and rows["line"].to_list() == [2, 4, 5]
    assert rows["source_key"].to_list() == ["T2", "T4", "T5"]
    items = pl.from_arrow(Manifest("down", store).item_index(["request_id", "user_prompt"]))
    prompts = dict(zip(items["request_id"], items["user_prompt"]))
    # the template's fields: the upstream's answer and its input row's own fields (normalised)
    for rid, line in zip(rows["request_id"], rows["line"]):
        rendered = f"other: subject {line}\nbody of ticket {line}"
        assert prompts[rid] == rendered
        # the ID hashes the upstream answer too (ids.with_upstream), by the documented formula
        prefix = ids.id_prefix("d1", spec.model, spec.settings_fingerprint())
        assert rid == ids.request_id(prefix, ids.with_upstream(rendered, "other"))


def test_a_changed_upstream_answer_changes_one_id_even_when_the_template_hides_it(jobs, tmp_path):
    _, down, source = jobs
    store = Store(tmp_path / "home")
    spec = down(where="output IN ('other', 'maybe')")
    spec = spec.model_copy(update={"prompt": spec.prompt.model_copy(update={"template": "{body}"})})
    publish_upstream(store, source, LABELS)
    build_manifest(spec, store)
    before = set(pl.from_arrow(Manifest("down", store).rows())["request_id"])
    publish_upstream(store, source, LABELS[:3] + ["maybe"] + LABELS[4:])  # line 4: other -> maybe
    summary = build_manifest(spec, store)
    after = pl.from_arrow(Manifest("down", store).rows()).sort("line")
    assert summary.new_requests == 1 and after["line"].to_list() == [2, 4, 5]
    assert set(after["request_id"]) - before == {after.filter(pl.col("line") == 4)["request_id"][0]}
    # a filter that no longer selects a row leaves it out of the live rows
    publish_upstream(store, source, LABELS[:4] + ["billing"] + LABELS[5:])  # line 5: other -> billing
    build_manifest(spec, store)
    assert pl.from_arrow(Manifest("down", store).rows()).sort("line")["line"].to_list() == [2, 4]


def test_confidence_below_and_missing_fields(jobs, tmp_path):
    _, down, source = jobs
    store = Store(tmp_path / "home")
    outputs = [json.dumps({"label": "x", "confidence": c}) for c in (0.9, 0.2, 0.5, 0.95, 0.1, 0.7)]
    json_up = base_spec_dict(
        source,
        name="up",
        output={
            "json_schema": {
                "type": "object",
                "properties": {"label": {"type": "string"}, "confidence": {"type": "number"}},
            }
        },
        sampling={"temperature": 0, "max_tokens": 64},
    )
    write_spec(tmp_path / "jobs", json_up, "up.yaml")
    publish_upstream(store, source, LABELS, outputs)
    spec = down(confidence_below={"field": "confidence", "threshold": 0.6})
    assert UpstreamTable(spec, store).rows()["line"].to_list() == [2, 3, 5]
    with pytest.raises(ConfigError, match="'certainty' is not a field of job up's JSON output"):
        checked_condition(down(confidence_below={"field": "certainty", "threshold": 0.6}))
    # a template field the upstream's input rows do not have: a reject naming the line, not a crash
    bad = down(where="line = 2")
    bad = bad.model_copy(update={"prompt": bad.prompt.model_copy(update={"template": "{body} {customer}"})})
    summary = build_manifest(bad, store)
    assert summary.new_requests == 0 and summary.rejects_by_reason == {"missing_field": 1}
    assert pl.from_arrow(Manifest("down", store).rejects())["line"].to_list() == [2]


def test_where_is_checked_against_the_validated_columns(jobs):
    _, down, _ = jobs
    with pytest.raises(ConfigError, match=r"input.where: no column 'label' in job up's validated table") as err:
        checked_condition(down(where="label = 'other'"))
    assert "output" in str(err.value)
    with pytest.raises(ConfigError, match="not a SQL condition"):
        checked_condition(down(where="output = = 'x'"))
    with pytest.raises(ConfigError, match="input.where (is not a SQL condition|must be one condition)"):
        checked_condition(down(where="true; SELECT 42"))
    assert checked_condition(down(where="output = 'other' AND NOT is_duplicate"))


def test_share_is_assumed_then_measured_on_the_table(jobs, tmp_path):
    _, down, source = jobs
    store = Store(tmp_path / "home")
    spec = down(where="output = 'other'", assumed_share=0.25)
    share = UpstreamTable(spec, store).share()
    assert (share.share, share.source, share.measured_on) == (0.25, ShareSource.ASSUMED, 0)
    publish_upstream(store, source, LABELS)
    share = UpstreamTable(spec, store).share()
    assert (share.share, share.source, share.measured_on) == (0.5, ShareSource.VALIDATED, 6)


def test_spec_rules_for_from_job(jobs, tmp_path):
    source = jobs[2]
    with pytest.raises(ConfigError, match="exactly one of input.path"):
        write_spec(
            tmp_path / "bad",
            {**base_spec_dict(source), "input": {"path": source, "from_job": "up", "text_field": "body"}},
        )
    with pytest.raises(ConfigError, match="filter an input.from_job table"):
        write_spec(
            tmp_path / "bad",
            {**base_spec_dict(source), "input": {"path": source, "where": "true", "text_field": "body"}},
        )
    cyclic = base_spec_dict("", name="loop", input={"from_job": "loop", "text_field": "body"})
    with pytest.raises(ConfigError, match="cycle"):
        chain(write_spec(tmp_path / "jobs", cyclic, "loop.yaml"))
    missing = base_spec_dict("", name="orphan", input={"from_job": "nobody", "text_field": "body"})
    with pytest.raises(ConfigError, match="'nobody', which has no spec"):
        chain(write_spec(tmp_path / "other", missing, "orphan.yaml"))
