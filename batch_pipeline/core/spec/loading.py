"""Reading job specs: YAML in, a validated ``JobSpec`` out, or a ConfigError naming the file, the line, the field
path and what was expected."""

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.spec.job import JobSpec


def _yaml_line(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest node on the pydantic error path."""
    line = None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            node = None
    if node is not None:
        line = node.start_mark.line + 1
    return line


def _format_errors(source: str, exc: ValidationError, root: yaml.Node | None) -> str:
    lines = [f"{source}: invalid job spec ({exc.error_count()} problem(s))"]
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-after")))
        field = ".".join(str(p) for p in loc) or "<top level>"
        where = _yaml_line(root, loc)
        at = f"line {where}, " if where else ""
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (not part of the job spec; check the spelling)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        got = "" if err["type"] in ("missing",) else f" (got {err.get('input')!r:.80})"
        lines.append(f"  {at}field '{field}': {msg}{got}")
    return "\n".join(lines)


def parse_spec(text: str, source: str = "<string>") -> JobSpec:
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a job spec must be a YAML mapping, got {type(data).__name__}")
    try:
        return JobSpec.model_validate({**data, "source_path": source if source != "<string>" else None})
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc, root)) from None


def load_spec(path: str | Path) -> JobSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read job spec: {exc.strerror}") from None
    return parse_spec(text, str(path))


def load_specs(jobs_dir: str | Path) -> list[JobSpec]:
    specs = [load_spec(p) for p in sorted(Path(jobs_dir).glob("*.yaml"))]
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{jobs_dir}: job names must be unique, repeated: {dupes}")
    return specs
