"""`batch-pipeline quote --compare` prices the whole job, and the remaining work when there is any, labelled."""

import dagster as dg

from batch_pipeline.cli import main
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.defs.pipeline import run_job


def _rows(section: str, backend: str) -> list[list[str]]:
    return [
        [c.strip() for c in ln.split("│") if c.strip()]
        for ln in section.splitlines()
        if ln.strip("│ ").startswith(backend + " ")
    ]


def _usd(cell: str) -> float:
    assert cell.startswith("$"), cell  # dollar columns read as dollars
    return float(cell.lstrip("$").replace(",", ""))


def _tables(out: str) -> tuple[str, str | None]:
    whole = out.index("the whole job")
    rest = out.find("the remaining work")
    return (out[whole:rest], out[rest:]) if rest > 0 else (out[whole:], None)


def test_compare_after_the_job_finished_prices_the_whole_job(sandbox, instance, resources, home, make_job, capsys):
    spec = make_job()
    assert run_job(spec, instance, resources)["complete"]
    capsys.readouterr()
    assert main(["quote", spec.source_path, "--home", str(home), "--compare"]) == 0
    out = capsys.readouterr().out
    assert "the whole job (40 requests) on each backend (all of it is done: nothing remains)" in out
    whole, rest = _tables(out)
    assert rest is None  # nothing remains: no second table of zeros
    [batch] = _rows(whole, "openai_batch")[:1]
    assert batch[1] == "gpt-4o-mini" and batch[2] == "40" and _usd(batch[3]) > 0, batch
    [anthropic] = [r for r in _rows(whole, "anthropic_batch") if r[1] == "claude-haiku-4-5"]
    assert anthropic[2] == "40" and _usd(anthropic[3]) > 0


def test_compare_with_work_left_prices_both_and_labels_them(sandbox, instance, resources, home, make_job, capsys):
    spec = make_job(canary_first=False)
    defs = build_definitions([spec], resources)
    graph = [*defs.assets, *defs.asset_checks]
    dg.materialize(
        graph,
        instance=instance,
        resources=defs.resources,
        selection=[dg.AssetKey([spec.name, "manifest"]), dg.AssetKey([spec.name, "quote"])],
    )
    dg.materialize(
        graph,
        instance=instance,
        resources=defs.resources,
        partition_key="s00001",
        selection=[dg.AssetKey([spec.name, "submissions"]), dg.AssetKey([spec.name, "shard_results"])],
    )
    capsys.readouterr()
    assert main(["quote", spec.source_path, "--home", str(home), "--compare"]) == 0
    out = capsys.readouterr().out
    assert "the whole job (40 requests) on each backend (10 done, 30 remain (priced below))" in out
    assert "the remaining work (30 of 40 requests) on each backend" in out
    whole, rest = _tables(out)
    w, r = _rows(whole, "openai_batch")[0], _rows(rest, "openai_batch")[0]
    assert w[2] == "40" and r[2] == "30"
    assert _usd(w[3]) > _usd(r[3]) > 0  # the whole job costs more than what is left of it
    assert _rows(whole, "self_hosted")[0][2] == "40" and _rows(rest, "self_hosted")[0][2] == "30"


def test_a_sub_cent_quote_keeps_its_significant_digits(make_job, home, capsys):
    import re

    spec = make_job(rows=[{"ticket_id": f"T{i}", "subject": "s", "body": f"refund please {i}"} for i in range(3)])
    assert main(["quote", spec.source_path, "--home", str(home)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if " low, " in ln)
    figures = re.findall(r"(\$[0-9.,]+) (low|expected|high)", line)
    assert [k for _, k in figures] == ["low", "expected", "high"], line
    amounts = [_usd(text) for text, _ in figures]
    assert 0 < amounts[0] <= amounts[1] <= amounts[2] < 0.01, line  # a sub-cent job, every figure non-zero
    assert "$0.0000 " not in line and all(re.search(r"[1-9]", text) for text, _ in figures), line
    assert "(budget $5.00;" in line, line


def test_a_job_without_a_budget_quotes_and_says_so(instance, resources, home, make_job, capsys):
    """``budget_usd`` is optional: the quote prints that none is set (it crashed formatting None as dollars)."""
    spec = make_job(name="nobudget", budget_usd=None)
    assert spec.budget_usd is None
    assert main(["quote", spec.source_path, "--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert "job nobudget: 40 requests on openai_batch/gpt-4o-mini:" in out and "(budget none set; within:" in out
    defs = build_definitions([spec], resources)  # the quote asset logs the same line
    result = dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[dg.AssetKey(["nobudget", "manifest"]), dg.AssetKey(["nobudget", "quote"])],
        instance=instance,
        resources=defs.resources,
    )
    assert result.success
