"""Small helpers to turn core records into Dagster metadata."""

import dagster as dg
import polars as pl


def md_table(frame: pl.DataFrame, limit: int = 10) -> dg.MetadataValue:
    """A Markdown preview of the first rows (long cells shortened)."""
    head = frame.head(limit)
    cols = head.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in head.iter_rows():
        cells = [str(v).replace("|", "\\|").replace("\n", " ")[:60] for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return dg.MetadataValue.md("\n".join(lines))


def plain(values: dict) -> dict:
    """Metadata from a flat dict: numbers, text and paths as Dagster values."""
    out = {}
    for key, value in values.items():
        if isinstance(value, bool):
            out[key] = dg.MetadataValue.bool(value)
        elif isinstance(value, int):
            out[key] = dg.MetadataValue.int(value)
        elif isinstance(value, float):
            out[key] = dg.MetadataValue.float(value)
        elif isinstance(value, str) and (value.startswith("/") or "://" in value):
            out[key] = dg.MetadataValue.path(value)
        elif value is None:
            continue
        else:
            out[key] = dg.MetadataValue.text(str(value))
    return out
