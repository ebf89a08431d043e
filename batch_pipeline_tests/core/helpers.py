"""Small builders shared by the core tests: job specs on disk, input files, raw result tables.

Nothing here imitates our own code: specs go through ``parse_spec``/``load_spec``, inputs are real
files, results are real Arrow tables in the executor's schema.
"""

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from batch_pipeline.core.ledger.executor import RAW_RESULT_SCHEMA
from batch_pipeline.core.manifest import ids
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.loading import load_spec

REPO = Path(__file__).resolve().parents[2]
DEMO_SPEC = REPO / "data" / "jobs" / "demo.yaml"


def load_make_samples():
    """The repo's sample generator (``scripts/`` is not a package)."""
    name = "make_samples_under_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def base_spec_dict(input_path: str, **overrides: Any) -> dict:
    """A minimal valid job spec as a dict; ``overrides`` replace top-level keys."""
    spec = {
        "name": "t",
        "input": {"path": input_path, "text_field": "body", "key_field": "id", "max_input_tokens": 100_000},
        "prompt": {"version": "v1", "system": "You label tickets.", "template": "Ticket:\n{body}"},
        "model": "m-1",
        "backend": {"name": "openai_batch"},
        "sampling": {"temperature": 0, "max_tokens": 8},
        "output": {"choice": ["billing", "bug", "other"]},
    }
    spec.update(overrides)
    return spec


def write_spec(dir_: Path, spec: dict, filename: str = "job.yaml") -> JobSpec:
    """Write ``spec`` as YAML under ``dir_`` and load it through the real loader."""
    dir_.mkdir(parents=True, exist_ok=True)
    path = dir_ / filename
    path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return load_spec(path)


def write_jsonl(path: Path, rows: list[Any], *, mode: str = "wb") -> Path:
    """Rows are dicts (dumped as JSON) or raw ``bytes`` lines (written verbatim)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode) as fh:
        for row in rows:
            line = row if isinstance(row, bytes) else json.dumps(row, ensure_ascii=False).encode("utf-8")
            fh.write(line + b"\n")
    return path


def reference_request_id(spec: JobSpec, row: dict[str, str]) -> str:
    """The documented formula, computed without the manifest's Polars path:
    sha256(prompt_version | model | settings fingerprint | normalised rendered input)."""
    rendered = spec.prompt.template.format(**{f: ids.normalize_text(row[f]) for f in spec.prompt.fields})
    payload = "\x1f".join((spec.prompt.version, spec.model, spec.settings_fingerprint(), rendered))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def raw_results(rows: list[dict[str, Any]]) -> pa.Table:
    """A raw provider result table; unspecified columns are null."""
    cols: dict[str, list] = {name: [r.get(name) for r in rows] for name in RAW_RESULT_SCHEMA.names}
    return pa.table(cols, schema=RAW_RESULT_SCHEMA)
