"""Small helpers to turn core records into Dagster metadata: dollars read as dollars, tables carry their schema."""

from collections.abc import Iterable

import dagster as dg
import polars as pl
import pyarrow as pa

from batch_pipeline.core import progress
from batch_pipeline.core.pricing.usd import format_usd
from batch_pipeline.core.spec.job import JobSpec

# what a column of the published tables (validated, results, dead letters) holds, shown in the UI's schema
COLUMN_DOCS = {
    "source": "input file the row came from",
    "line": "1-based line (row) in that file",
    "source_key": "the row's own key (input.key_field), if any",
    "request_id": "sha256 of prompt version, model, settings and normalised input: one paid request",
    "shard_id": "the shard (dynamic partition) the request belongs to",
    "output": "the parsed answer (a label of output.choice, or the JSON text)",
    "output_text": "the model's raw text",
    "finish_reason": "why the model stopped (length = truncated)",
    "model": "the model that answered",
    "prompt_version": "prompt.version of the spec that built the request",
    "backend": "the backend that answered",
    "pricing": "batch or interactive price",
    "attempt": "the attempt that produced this result (1 = first try)",
    "input_tokens": "prompt tokens billed",
    "cached_tokens": "prompt tokens read from the provider's cache",
    "output_tokens": "completion tokens billed",
    "cost_usd": "what the request cost in USD (0 on a duplicate row: its request was paid once)",
    "is_duplicate": "the row repeats an earlier row's request (answered, not paid again)",
    "provider_batch_id": "the provider's batch that answered",
    "embedding": "the embedding vector",
    "failures": "failed attempts that spent the item's budget",
    "last_error_code": "the last error's code (replay --code matches it)",
    "last_error": "the last error's message",
    "error_class": "transient, poison, invalid_output or systemic",
}


def is_money(key: str) -> bool:
    """Metadata keys in dollars end in ``_usd`` (cost_usd, budget_usd, cost_high_usd, ...)."""
    return key.endswith("_usd")


def usd(amount: float | None) -> dg.MetadataValue:
    """A dollar amount as text the UI shows as is (``$0.0379``); a float would show ``1.9274999999e-05``."""
    return dg.MetadataValue.text("n/a" if amount is None else format_usd(float(amount)))


def text_key(key: str) -> str:
    """The key of the formatted text shown beside a dollar amount (``cost_usd`` -> ``cost_usd_text``)."""
    return f"{key}_text"


def money_json(value, money: bool = False, money_keys: Iterable[str] = ()):
    """A JSON-ready copy with every amount under a dollar key (or under ``money_keys``) formatted as dollars."""
    keys = set(money_keys)
    if isinstance(value, dict):
        return {k: money_json(v, money or is_money(str(k)) or k in keys, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [money_json(v, money, keys) for v in value]
    if money and isinstance(value, int | float) and not isinstance(value, bool):
        return format_usd(float(value))
    return value


def _cell(column: str, value) -> str:
    if isinstance(value, float):
        text = format_usd(value) if is_money(column) else f"{value:.6g}"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")[:60]


def md_table(frame: pl.DataFrame, limit: int = 10) -> dg.MetadataValue:
    """A Markdown preview of the first rows (long cells shortened, dollars as dollars)."""
    head = frame.head(limit)
    cols = head.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in head.iter_rows():
        lines.append("| " + " | ".join(_cell(c, v) for c, v in zip(cols, row)) + " |")
    return dg.MetadataValue.md("\n".join(lines))


def column_schema(schema: pa.Schema | pl.Schema) -> dg.TableSchema:
    """The table's columns and types (and what each holds) for ``dagster/column_schema``."""
    pairs = (
        [(f.name, str(f.type)) for f in schema]
        if isinstance(schema, pa.Schema)
        else [(name, str(dtype)) for name, dtype in schema.items()]
    )
    return dg.TableSchema(
        columns=[dg.TableColumn(name, type_, description=COLUMN_DOCS.get(name)) for name, type_ in pairs]
    )


def table_meta(schema: pa.Schema | pl.Schema, rows: int) -> dict[str, dg.MetadataValue]:
    """What the UI shows for a table asset: its column schema and its row count."""
    return {
        "dagster/column_schema": dg.MetadataValue.table_schema(column_schema(schema)),
        "dagster/row_count": dg.MetadataValue.int(rows),
    }


def plain(values: dict) -> dict:
    """Metadata from a flat dict: numbers, text and paths as Dagster values. A dollar amount stays a number (the
    asset's Plots tab draws it over time) with its text beside it (``cost_usd`` 2.2425e-05, ``cost_usd_text``
    ``$0.0000224``)."""
    out = {}
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out[key] = dg.MetadataValue.bool(value)
        elif is_money(key) and isinstance(value, int | float):
            out[key] = dg.MetadataValue.float(float(value))
            out[text_key(key)] = usd(value)
        elif isinstance(value, int):
            out[key] = dg.MetadataValue.int(value)
        elif isinstance(value, float):
            out[key] = dg.MetadataValue.float(value)
        elif isinstance(value, str) and (value.startswith("/") or "://" in value):
            out[key] = dg.MetadataValue.path(value)
        else:
            out[key] = dg.MetadataValue.text(str(value))
    return out


def spec_labels(spec: JobSpec) -> dict:
    """The spec's ``owners`` and ``tags`` as keyword arguments of an asset or job (none when the spec has none)."""
    out: dict = {}
    if spec.owners:
        out["owners"] = list(spec.owners)
    if spec.tags:
        out["tags"] = dict(spec.tags)
    return out


def progress_meta(meter: progress.Meter) -> dict[str, dg.MetadataValue]:
    """The run's share of a step as the CLI's bar shows it: count, rate, elapsed."""
    f = meter.figures()
    return {
        f"progress_{f.unit}": dg.MetadataValue.int(f.done),
        f"progress_{f.unit}_per_s": dg.MetadataValue.float(round(f.rate_per_s, 3)),
        "progress_elapsed_s": dg.MetadataValue.float(round(f.elapsed_s, 3)),
    }


def per_shard_meta(counts: dict[str, dict[str, int]]) -> dict[str, dg.MetadataValue]:
    """A run over one shard states that shard's counts. A ranged run records ONE materialization for all its
    partitions (Dagster has no per-partition result within a step), so its totals are labelled as the run's, and
    each shard's own counts are a row of ``per_shard``: a shard's partition page never shows its range's totals
    as its own."""
    if len(counts) == 1:
        return {name: dg.MetadataValue.int(value) for name, value in next(iter(counts.values())).items()}
    names = list(next(iter(counts.values()), {}))
    totals = {name: sum(c[name] for c in counts.values()) for name in names}
    rows = ["| shard | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    rows += [f"| {shard} | " + " | ".join(str(c[n]) for n in names) + " |" for shard, c in counts.items()]
    return {
        "shards_in_run": dg.MetadataValue.text(", ".join(counts)),
        **{f"run_{name}": dg.MetadataValue.int(value) for name, value in totals.items()},
        "per_shard": dg.MetadataValue.md("\n".join(rows)),
    }


def provider_ceilings(spec: JobSpec, store) -> dict:
    """For the report: every open batch's age against its provider's window and retention (with the warnings)
    and the shards held for a human (results lost at the provider)."""
    from batch_pipeline.core.ledger.ceilings import open_batch_ages
    from batch_pipeline.core.ledger.control import JobControl
    from batch_pipeline.core.run.summary import ShardSummaries
    from batch_pipeline.executors.registry import batch_ceilings

    opened = [(s.shard_id, s.open.submitted) for s in ShardSummaries(spec, store).all() if s.open and s.open.submitted]
    ages = open_batch_ages(opened, batch_ceilings(spec.backend), spec.source_path or spec.name)
    return {"open_batches": [a.as_dict() for a in ages], "held_shards": JobControl(store, spec.name).shard_holds()}
