"""input.from_job across a project's two places: an upstream in the jobs folder (``data/jobs/*.yaml``) or in the dg
defs folder (``batch_pipeline/jobs/<job>/defs.yaml``) is found from a job in either."""

from pathlib import Path

import pytest
import yaml

from batch_pipeline.core.manifest.upstream import chain, downstream_specs
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.job_files import COMPONENT_TYPE, load_job_file
from batch_pipeline_tests.core.helpers import base_spec_dict, write_jsonl

DOWN_INPUT = {"from_job": "up", "text_field": "body"}


def write_job(project: Path, place: str, spec: dict) -> JobSpec:
    """Write ``spec`` in the project's jobs folder (``jobs``) or as a defs folder Component (``defs``), and load it."""
    if place == "jobs":
        path = project / "data" / "jobs" / f"{spec['name']}.yaml"
        doc = spec
    else:
        path = project / "batch_pipeline" / "jobs" / spec["name"] / "defs.yaml"
        doc = {"type": COMPONENT_TYPE, "attributes": spec}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return load_job_file(path)


@pytest.mark.parametrize(("up_place", "down_place"), [("jobs", "defs"), ("defs", "jobs"), ("defs", "defs")])
def test_from_job_finds_its_upstream_in_either_place_of_the_project(tmp_path, up_place, down_place):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[tool.dg]\ndirectory_type = "project"\n', encoding="utf-8")
    source = write_jsonl(tmp_path / "in" / "tickets.jsonl", [{"id": "T1", "body": "a ticket"}])
    up = write_job(project, up_place, base_spec_dict(str(source), name="up"))
    down = write_job(project, down_place, base_spec_dict("", name="down", input=DOWN_INPUT))
    assert [s.name for s in chain(down)] == ["up", "down"]
    assert chain(down)[0].source_path == up.source_path
    assert [s.name for s in downstream_specs(up)] == ["down"]
