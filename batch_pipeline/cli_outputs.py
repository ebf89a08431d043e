"""`batch-pipeline export | report`: a job's published outputs, in the formats people load them in.

``export`` writes the validated table as Parquet, CSV, JSON lines, or an OpenAI batch output file (what OpenAI and
vLLM's ``run_batch`` write; dead letters go to the matching error file beside it). ``report`` prints the run's
report (the table ``run`` prints at the end) and where its spend plot is. Both read only the store.
"""

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.table import Table

from batch_pipeline.cli_jobs import resolve_job, store_for
from batch_pipeline.cli_stops import ExitCode
from batch_pipeline.core.pricing.usd import format_usd
from batch_pipeline.core.spec.paths import JobPaths
from batch_pipeline.core.store import Store


def _atomic(out: Path, write: Callable[[Path], None]) -> None:
    """Write through a temporary name beside ``out``, so a reader never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _openai_batch(frame: pl.DataFrame, dead: pl.DataFrame | None, out: Path) -> list[Path]:
    from batch_pipeline.executors.openai.export import export_openai_batch_errors, export_openai_batch_output

    export_openai_batch_output(frame, out)
    if dead is None or dead.height == 0:
        return [out]
    errors = out.with_name(out.name.removesuffix(".jsonl") + ".errors.jsonl")
    export_openai_batch_errors(dead, errors)
    return [out, errors]


def _plain(write: Callable[[pl.DataFrame, Path], None]):
    def export(frame: pl.DataFrame, dead: pl.DataFrame | None, out: Path) -> list[Path]:
        _atomic(out, lambda tmp: write(frame, tmp))
        return [out]

    return export


@dataclass(frozen=True)
class ExportFormat:
    suffix: str  # of the default file name, <job><suffix> in the working directory
    write: Callable[[pl.DataFrame, pl.DataFrame | None, Path], list[Path]]


EXPORTS: dict[str, ExportFormat] = {
    "openai-batch": ExportFormat(".batch_output.jsonl", _openai_batch),
    "parquet": ExportFormat(".parquet", _plain(lambda f, p: f.write_parquet(p))),
    "csv": ExportFormat(".csv", _plain(lambda f, p: f.write_csv(p))),
    "jsonl": ExportFormat(".jsonl", _plain(lambda f, p: f.write_ndjson(p))),
}


def _read(store: Store, rel: str) -> pl.DataFrame | None:
    table = store.read_part(rel) if store.exists(rel) else None
    if table is None:
        return None
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    spec = resolve_job(args.job, args.settings)
    store, paths = store_for(args.settings), JobPaths(spec.name)
    validated = _read(store, paths.validated)
    if validated is None:
        console.print(
            f"job {spec.name}: no validated table in {store.root} yet; run it first "
            f"(`batch-pipeline run {spec.source_path or spec.name}`)"
        )
        return ExitCode.BAD_INPUT
    fmt = EXPORTS[args.format]
    out = Path(args.out) if args.out else Path.cwd() / f"{spec.name}{fmt.suffix}"
    written = fmt.write(validated, _read(store, paths.dead_letters), out)
    console.print(
        f"job {spec.name}: {validated.height} validated rows exported as {args.format} to {written[0]}"
        + (f"; dead letters to {written[1]}" if len(written) > 1 else ""),
        markup=False,
        highlight=False,
    )
    return ExitCode.DONE


def print_summary(report: dict, console: Console) -> None:
    """The report as a table: counts, tokens, cost, the quote, and where the published tables are."""
    from batch_pipeline.core.publish.report import SUMMARY_ROWS

    table = Table(title=f"job {report.get('job')}: summary", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right", overflow="fold")
    for label, key in SUMMARY_ROWS:
        value = report.get(key)
        table.add_row(label, _value(key, value))
    quoted = (report.get("quoted_vs_actual") or {}).get("quoted_usd")
    if quoted:
        table.add_row(
            "quoted before the run (USD)",
            f"{format_usd(quoted['expected'])} expected, {format_usd(quoted['high'])} high",
        )
    golden = report.get("golden_accuracy_by_shard") or []
    if golden:
        correct, probes = sum(g["correct"] for g in golden), sum(g["probes"] for g in golden)
        table.add_row("golden accuracy (probes)", f"{correct / probes:.3f} on {probes} probes in {len(golden)} shards")
    by_pricing = report.get("cost_by_pricing") or {}
    if len(by_pricing) > 1:
        table.add_row("cost by pricing (USD)", ", ".join(f"{k} {format_usd(v)}" for k, v in sorted(by_pricing.items())))
    if report.get("wall_time_s") is not None:
        table.add_row("wall time (s)", str(report.get("wall_time_s")))
    outputs = report.get("outputs", {})
    validated = str(outputs.get("validated", ""))
    table.add_row("validated table", validated)
    if outputs.get("duckdb"):
        table.add_row("DuckDB file", str(outputs["duckdb"]))
    elif "://" in validated:  # a remote home: no local DuckDB file; DuckDB reads the Parquet where it is
        table.add_row("DuckDB (remote Parquet)", duckdb_remote_query(validated))
    console.print(table)
    if not report.get("complete"):
        console.print(
            f"[yellow]not complete: {report.get('missing')} missing, {report.get('invalid')} invalid; "
            "run again to resume[/yellow]"
        )


def _value(key: str, value) -> str:
    """A summary cell: dollars with their significant digits ($0.0000052), other figures as they are."""
    if key.endswith("_usd") and isinstance(value, int | float) and not isinstance(value, bool):
        return format_usd(float(value))
    return f"{value:.6f}" if isinstance(value, float) else str(value)


def duckdb_remote_query(uri: str) -> str:
    """How to query a table on object storage with DuckDB's httpfs (credentials from the usual AWS chain)."""
    return (
        f'no local DuckDB file on a remote home; query the Parquet in place: duckdb -c "INSTALL httpfs; '
        f"LOAD httpfs; CREATE SECRET (TYPE s3, PROVIDER credential_chain); "
        f"SELECT * FROM read_parquet('{uri}') LIMIT 10\" (set ENDPOINT/URL_STYLE in the secret for a "
        f"non-AWS S3)"
    )


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    spec = resolve_job(args.job, args.settings)
    store, paths = store_for(args.settings), JobPaths(spec.name)
    report = store.read_json(paths.report)
    if report is None:
        console.print(
            f"job {spec.name}: no report in {store.root} yet; run it first "
            f"(`batch-pipeline run {spec.source_path or spec.name}`)"
        )
        return ExitCode.BAD_INPUT
    print_summary(report, console)
    by_attempt = report.get("cost_by_attempt") or {}
    if by_attempt:
        console.print(
            "cost by attempt (USD): "
            + ", ".join(f"{k} {format_usd(v)}" if isinstance(v, float) else f"{k} {v}" for k, v in by_attempt.items()),
            markup=False,
            highlight=False,
        )
    png = store.uri(paths.report_png) if store.exists(paths.report_png) else "none (the report asset writes it)"
    console.print(f"plot (spend over time): {png}", markup=False, highlight=False)
    return ExitCode.DONE


def add_output_commands(sub, console: Console) -> None:
    p = sub.add_parser("export", help="write the validated table as openai-batch, parquet, csv or jsonl")
    p.add_argument("job", help="job name or spec path")
    p.add_argument("--format", choices=sorted(EXPORTS), default="parquet")
    p.add_argument("--out", help="file to write (default ./<job><suffix of the format>)")
    p.add_argument("--home")
    p.set_defaults(fn=lambda args: cmd_export(args, console))
    p = sub.add_parser("report", help="the job's report table and the path of its plot")
    p.add_argument("job", help="job name or spec path")
    p.add_argument("--home")
    p.set_defaults(fn=lambda args: cmd_report(args, console))
