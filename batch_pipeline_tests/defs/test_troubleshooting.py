"""The troubleshooting page (docs/troubleshooting.md) shows the code's table: every stop code, wait kind and check
the code defines has a row, no row names something the code cannot produce, and the page is what
``render_markdown()`` renders today."""

import ast
from pathlib import Path

import pytest

from batch_pipeline.core.errors import SYSTEMIC_CODES
from batch_pipeline.core.spec.loading import load_spec
from batch_pipeline.core.state.driver import WaitKind
from batch_pipeline.core.troubleshooting import (
    OTHER_PROVIDER_CODE,
    TROUBLES,
    TroubleKind,
    for_stop,
    lookup,
    render_markdown,
)
from batch_pipeline.defs.build import build_definitions
from batch_pipeline.executors.google.format import SYSTEMIC_REASONS

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "batch_pipeline"
PAGE = REPO / "docs" / "troubleshooting.md"
START, END = "<!-- troubleshooting:start -->", "<!-- troubleshooting:end -->"


def literal_stop_codes(source: str) -> set[str]:
    """The literal ``code="..."`` of every ``SystemicError(...)`` and ``<control>.stop(...)`` call in a module."""
    codes = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name not in ("SystemicError", "stop"):
            continue
        for kw in node.keywords:
            if kw.arg == "code" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                codes.add(kw.value.value)
    return codes


def code_stop_codes() -> set[str]:
    """Every stop code the package (not the sandbox) can write: literals, the systemic table, Google's reasons."""
    codes = set(SYSTEMIC_CODES) | set(SYSTEMIC_REASONS.values())
    for path in PACKAGE.rglob("*.py"):
        if "sandbox" not in path.relative_to(PACKAGE).parts:
            codes |= literal_stop_codes(path.read_text())
    return codes


def rows(kind: TroubleKind) -> set[str]:
    return {t.name for t in TROUBLES if t.kind == kind}


def test_the_scanner_finds_literal_codes_and_ignores_computed_ones():
    src = (
        "raise SystemicError('x', code='budget')\ncontrol.stop(reason, code='retry_cap')\n"
        "raise SystemicError('y', code=exc.code)\nother(code='not_a_stop')\n"
    )
    assert literal_stop_codes(src) == {"budget", "retry_cap"}


def test_every_stop_code_has_a_row_and_every_row_is_a_code():
    codes = code_stop_codes()
    assert {"budget", "retry_cap", "canary_failed", "batch_failed", "invalid_api_key"} <= codes  # the scan sees them
    assert rows(TroubleKind.STOP) - {OTHER_PROVIDER_CODE} == codes


def test_every_wait_kind_has_a_row():
    assert rows(TroubleKind.WAIT) == {w.value for w in WaitKind}


def test_every_check_has_a_row_of_its_severity():
    defs = build_definitions([load_spec(REPO / "data" / "jobs" / "demo.yaml")])
    checks = [spec for c in defs.asset_checks or [] for spec in c.check_specs]
    assert checks, "the demo defines no checks?"
    assert rows(TroubleKind.BLOCKING_CHECK) == {c.name for c in checks if c.blocking}
    assert rows(TroubleKind.WARNING_CHECK) == {c.name for c in checks if not c.blocking}


def test_names_are_unique():
    assert len({t.name for t in TROUBLES}) == len(TROUBLES)


def shown_table(page: str) -> str:
    """The text between the page's markers (each exactly once), as ``render_markdown()`` ends it."""
    assert page.count(START) == 1 and page.count(END) == 1, f"{PAGE.name} needs each marker exactly once"
    return page.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def test_the_docs_page_shows_the_table_rendered_from_the_code():
    page = PAGE.read_text()
    assert page.startswith("# Troubleshooting\n")
    assert shown_table(page) == render_markdown(), (
        f"{PAGE.relative_to(REPO)} is stale: paste `python -m batch_pipeline.core.troubleshooting` between the markers"
    )


def test_a_drifted_page_fails_the_comparison():
    """The comparison sees a row the code no longer renders, and a row the page lacks."""
    table = render_markdown()
    drifted = table.replace(f"| `{TROUBLES[0].name}` |", "| `renamed_code` |")
    assert shown_table(f"{START}\n{drifted}{END}\n") != table
    missing = "".join(line + "\n" for line in table.splitlines()[:-1])
    assert shown_table(f"{START}\n{missing}{END}\n") != table
    assert shown_table(f"x\n{START}\n{table}{END}\ny\n") == table


def test_the_readme_links_the_page_and_keeps_no_copy():
    readme = (REPO / "README.md").read_text()
    assert "(docs/troubleshooting.md)" in readme
    assert START not in readme and "| shows as | name |" not in readme  # one copy: the page's


@pytest.mark.parametrize(
    "code,expected",
    [
        ("budget", "budget"),
        ("unauthenticated", OTHER_PROVIDER_CODE),
        (None, OTHER_PROVIDER_CODE),
        ("paused", OTHER_PROVIDER_CODE),
    ],
)
def test_for_stop_falls_back_to_the_provider_row(code, expected):
    assert for_stop(code).name == expected


def test_lookup_names_a_check_and_nothing_else():
    row = lookup("no_truncated_outputs")
    assert row is not None and "replay" in row.fix
    assert lookup("no_such_thing") is None
