"""The docs stay navigable and true, checked without building them (CI's ``mkdocs build --strict`` in
scripts/lint.sh checks links and anchors): every page in mkdocs.yml's nav exists and every page is in it, the
README's links resolve and reach every page, every key of the job spec and of every backend's settings model is
named on its docs page, and the architecture page lists the core's layers in the order the import test enforces."""

import re
from pathlib import Path

import pytest
import yaml

from batch_pipeline import core
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.executors import registry
from batch_pipeline.executors.settings import BatchProviderSettings

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def nav_pages(node) -> list[str]:
    """Every page file named in a mkdocs nav (nested sections included)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in nav_pages(value)]
    raise AssertionError(f"unexpected nav entry {node!r}")


def config() -> dict:
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    cfg = config()
    assert cfg["theme"]["name"] == "material" and cfg["strict"] is True and cfg["docs_dir"] == "docs"
    pages = nav_pages(cfg["nav"])
    assert len(pages) == len(set(pages)), "a page is in the nav twice"
    assert [p for p in pages if not (DOCS / p).is_file()] == []
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(pages)


def test_the_readme_links_resolve_and_reach_every_page():
    readme = (REPO / "README.md").read_text()
    targets = [t for t in LINK.findall(readme) if "://" not in t]
    broken = [t for t in targets if not (REPO / t.split("#", 1)[0]).exists()]
    assert broken == []
    linked = {t.split("#", 1)[0] for t in targets}
    assert {f"docs/{p}" for p in nav_pages(config()["nav"]) if p != "index.md"} <= linked
    assert {"docs/ui/asset_graph.png", "docs/ui/results.png"} <= linked  # the tour's screenshots


def test_the_readme_keeps_the_two_commands_ci_runs():
    readme = (REPO / "README.md").read_text()
    assert "./scripts/test.sh" in readme and "./scripts/demo.sh" in readme
    assert "./scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    assert "mkdocs build --strict" in (REPO / "scripts" / "lint.sh").read_text()


def section(text: str, heading: str) -> str:
    """From a heading line (its start) to the next heading of the same or a higher level."""
    start = text.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    rest = text[start + len(heading) :]
    end = re.search(rf"^#{{1,{level}}} ", rest, flags=re.M)
    return rest[: end.start()] if end else rest


def named(text: str) -> set[str]:
    """Every name in backticks outside code blocks (a fence's backticks would pair up with the wrong ones)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {span.strip() for span in re.findall(r"`([^`\n]+)`", prose)}


@pytest.mark.parametrize("backend", registry.names())
def test_every_backend_setting_is_named_on_its_page(backend):
    model = registry.executor_class(backend).settings_model
    if backend == "vllm":
        own = named(section((DOCS / "vllm.md").read_text(), "## Settings"))
        common = set()
    else:
        page = (DOCS / "backends.md").read_text()
        own = named(section(page, f"### `{backend}`"))
        common = named(section(page, "## Keys every provider backend takes"))
        if backend == "azure_openai_batch":  # "everything openai_batch takes", plus its own
            own |= named(section(page, "### `openai_batch`"))
    inherited = set(BatchProviderSettings.model_fields)
    missing = [f for f in model.model_fields if f not in own and not (f in inherited and f in common)]
    assert missing == [], f"{backend}: settings not named on its docs page"


def test_every_job_spec_key_is_in_the_configuration_table():
    table = named(section((DOCS / "configuration.md").read_text(), "## Job spec keys"))
    keys = set(JobSpec.model_fields) - {"source_path"}  # set by the loader, not written in a spec
    assert sorted(keys - table) == []


def test_the_architecture_page_lists_the_layers_in_order():
    page = section((DOCS / "architecture.md").read_text(), "## The core's layers")
    listed = []
    for line in re.findall(r"^- (.+?): ", page, flags=re.M):
        listed += [name.strip("` ") for name in line.split(",")]
    assert listed == list(reversed(core.LAYERS)), "the page's layers (top first) differ from core.LAYERS"
    assert core.__doc__ is not None and all(f"``{name}``" in core.__doc__ for name in core.LAYERS)
