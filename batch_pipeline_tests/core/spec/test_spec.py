"""Job spec errors name the file, the line, the field path and what was expected."""

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.spec.loading import load_spec, load_specs, parse_spec
from batch_pipeline_tests.core.helpers import DEMO_SPEC

# line numbers are part of the fixture: keep this text as it is
BASE = """\
name: ticket_triage
input: {path: data/samples/tickets/*.jsonl, text_field: body, key_field: ticket_id}
prompt:
  version: v3
  system: |
    You label support tickets.
  template: "Ticket:\\n{body}"
model: gpt-4o-mini
backend: {name: openai_batch}
sampling:
  temperature: 0
  max_tokens: 8
output:
  choice: [billing, bug, other]
shards: {max_requests: 5000}
retries: {per_item: 3, spend_cap_share: 0.10}
budget_usd: 25
"""


def spec_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "data" / "jobs" / "broken.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_spec(path)
    message = str(exc.value)
    assert message.startswith(str(path)), message  # the file
    return message


def problem_line(message: str, field: str) -> str:
    lines = [ln for ln in message.splitlines() if f"field '{field}'" in ln]
    assert len(lines) == 1, message
    return lines[0]


def line_of(line: str) -> int:
    m = re.search(r"\bline (\d+)\b", line)
    assert m, line
    return int(m.group(1))


def test_base_spec_is_valid():
    spec = parse_spec(BASE)
    assert spec.prompt.fields == ["body"]
    assert spec.output.kind == "choice"


def test_unknown_key(tmp_path):
    msg = spec_error(tmp_path, BASE.replace("  temperature: 0", "  temprature: 0"))
    line = problem_line(msg, "sampling.temprature")
    assert line_of(line) == 11
    assert "unknown key" in line


def test_unknown_top_level_key(tmp_path):
    msg = spec_error(tmp_path, BASE + "budget_usdd: 3\n")
    line = problem_line(msg, "budget_usdd")
    assert line_of(line) == 18 and "unknown key" in line


def test_missing_key(tmp_path):
    msg = spec_error(tmp_path, BASE.replace("  max_tokens: 8\n", ""))
    line = problem_line(msg, "sampling.max_tokens")
    assert "required key is missing" in line
    assert line_of(line) in (10, 11)  # the `sampling:` mapping that lacks it


def test_missing_top_level_key(tmp_path):
    msg = spec_error(tmp_path, BASE.replace("model: gpt-4o-mini\n", ""))
    assert "required key is missing" in problem_line(msg, "model")


def test_wrong_type(tmp_path):
    msg = spec_error(tmp_path, BASE.replace("max_tokens: 8", "max_tokens: plenty"))
    line = problem_line(msg, "sampling.max_tokens")
    assert line_of(line) == 12
    assert "valid integer" in line and "plenty" in line


def test_wrong_type_in_flow_mapping(tmp_path):
    msg = spec_error(tmp_path, BASE.replace("per_item: 3", "per_item: [3]"))
    line = problem_line(msg, "retries.per_item")
    assert line_of(line) == 16 and "valid integer" in line


def test_out_of_range_value(tmp_path):
    msg = spec_error(tmp_path, BASE.replace("temperature: 0", "temperature: 5"))
    line = problem_line(msg, "sampling.temperature")
    assert line_of(line) == 11 and "less than or equal to 2" in line


def test_template_placeholder_that_is_not_a_plain_field(tmp_path):
    msg = spec_error(tmp_path, BASE.replace('"Ticket:\\n{body}"', '"Ticket:\\n{body} {0}"'))
    line = problem_line(msg, "prompt.template")
    assert line_of(line) == 7 and "{0}" in line and "plain field name" in line


def test_template_that_does_not_use_the_text_field(tmp_path):
    """``{bdy}`` instead of ``{body}``: the error must point into the prompt block (lines 3-7) under the field
    path ``prompt`` / ``prompt.template``, not at ``<top level>`` line 1."""
    msg = spec_error(tmp_path, BASE.replace("{body}", "{bdy}"))
    assert "{body}" in msg and "bdy" in msg
    [line] = [ln for ln in msg.splitlines()[1:]]
    assert "field 'prompt.template'" in line or "field 'prompt'" in line, line
    assert 3 <= line_of(line) <= 7, line


def test_output_with_two_contracts(tmp_path):
    msg = spec_error(
        tmp_path, BASE.replace("  choice: [billing, bug, other]", "  choice: [billing, bug, other]\n  text: {}")
    )
    line = problem_line(msg, "output")
    assert line_of(line) in (13, 14)
    assert "exactly one of choice, json_schema, text" in line and "choice" in line and "text" in line


def test_output_with_no_contract_and_bad_choice_lists(tmp_path):
    assert "got none" in problem_line(
        spec_error(tmp_path, BASE.replace("  choice: [billing, bug, other]", "  {}")), "output"
    )
    dup = spec_error(tmp_path, BASE.replace("[billing, bug, other]", "[bug, bug]"))
    assert "distinct" in problem_line(dup, "output")
    schema = spec_error(tmp_path, BASE.replace("  choice: [billing, bug, other]", "  json_schema: {type: array}"))
    assert "type: object" in problem_line(schema, "output")


def test_several_problems_are_all_reported(tmp_path):
    text = BASE.replace("model: gpt-4o-mini", "model: gpt-4o-mini\nmodle: x").replace("max_tokens: 8", "max_tokens: -1")
    msg = spec_error(tmp_path, text)
    assert "(2 problem(s))" in msg
    assert line_of(problem_line(msg, "modle")) == 9
    assert "greater than 0" in problem_line(msg, "sampling.max_tokens")


def test_bad_job_name(tmp_path):
    msg = spec_error(tmp_path, BASE.replace("name: ticket_triage", "name: Ticket-Triage"))
    line = problem_line(msg, "name")
    assert line_of(line) == 1 and "Ticket-Triage" in line


def test_not_yaml_and_not_a_mapping(tmp_path):
    assert "not valid YAML" in spec_error(tmp_path, BASE.replace("model: gpt-4o-mini", "model: [gpt"))
    assert "must be a YAML mapping" in spec_error(tmp_path, "- a\n- b\n")


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read job spec"):
        load_spec(tmp_path / "missing.yaml")


def test_duplicate_job_names(tmp_path):
    for n in ("a", "b"):
        (tmp_path / f"{n}.yaml").write_text(BASE)
    with pytest.raises(ConfigError, match=r"ticket_triage"):
        load_specs(tmp_path)


def test_demo_spec_loads_and_resolves_relative_to_the_project(tmp_path):
    spec = load_spec(DEMO_SPEC)
    assert spec.name == "demo"
    assert spec.prompt.fields == ["subject", "body"]
    assert spec.input_base_dir() == DEMO_SPEC.resolve().parents[2]
    # a spec outside data/jobs resolves against its own directory
    other = tmp_path / "elsewhere" / "demo.yaml"
    other.parent.mkdir()
    other.write_text(DEMO_SPEC.read_text())
    assert load_spec(other).input_base_dir() == other.parent.resolve()


def test_settings_fingerprint_is_stable_and_sensitive():
    a = parse_spec(BASE)
    assert a.settings_fingerprint() == parse_spec(BASE).settings_fingerprint()
    assert re.fullmatch(r"[0-9a-f]{16}", a.settings_fingerprint())
    # key order and YAML style do not matter; content does
    reordered = BASE.replace("  temperature: 0\n  max_tokens: 8\n", "  max_tokens: 8\n  temperature: 0.0\n")
    assert parse_spec(reordered).settings_fingerprint() == a.settings_fingerprint()
    assert parse_spec(BASE.replace("max_tokens: 8", "max_tokens: 9")).settings_fingerprint() != a.settings_fingerprint()


def test_deadline_is_parsed_as_aware_datetime():
    spec = parse_spec(BASE + "deadline: 2026-12-01T06:00:00Z\n")
    assert spec.deadline == datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
