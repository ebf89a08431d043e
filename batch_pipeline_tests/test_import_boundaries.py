"""Imports point one way: ``core/`` never pulls in dagster, an SDK or another layer of the package, and the
sandbox stands apart from core, executors and defs.

Checked twice: at runtime in a fresh interpreter (what ``import`` really loads, transitively) and statically
over the source (imports hidden inside functions that a plain import would not trigger).
"""

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import batch_pipeline

PACKAGE_DIR = Path(batch_pipeline.__file__).resolve().parent
CORE_FORBIDDEN = [
    "dagster",
    "batch_pipeline.executors",
    "batch_pipeline.defs",
    "batch_pipeline.sandbox",
    "openai",
    "anthropic",
]
SANDBOX_FORBIDDEN = ["batch_pipeline.core", "batch_pipeline.executors", "batch_pipeline.defs", "dagster"]

PROBE = r"""
import importlib, json, pkgutil, sys
package, forbidden = sys.argv[1], json.loads(sys.argv[2])
pkg = importlib.import_module(package)
names = sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, package + "."))
def offenders():
    return sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden))
report = {"modules": names, "blame": {}, "errors": {}}
for name in names:
    before = set(offenders())
    try:
        importlib.import_module(name)
    except Exception as exc:
        report["errors"][name] = f"{type(exc).__name__}: {exc}"
        continue
    new = sorted(set(offenders()) - before)
    if new:
        report["blame"][name] = new
report["offenders"] = offenders()
print(json.dumps(report))
"""


def probe(package: str, forbidden: list[str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, package, json.dumps(forbidden)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PACKAGE_DIR.parent,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def source_modules(subpackage: str) -> list[Path]:
    return sorted((PACKAGE_DIR / subpackage).rglob("*.py"))


def dotted(path: Path) -> str:
    """``core/state/view.py`` -> ``batch_pipeline.core.state.view``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
    return ".".join(("batch_pipeline", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imported_names(path: Path, package: str) -> set[str]:
    """Every module an ``import`` statement in ``path`` names, at any depth, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{alias.name}" for alias in node.names)
    return names


def hits(names: set[str], forbidden: list[str]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


def test_core_imports_nothing_forbidden_at_runtime():
    report = probe("batch_pipeline.core", CORE_FORBIDDEN)
    expected = {dotted(p) for p in source_modules("core")} - {"batch_pipeline.core"}
    assert set(report["modules"]) == expected and len(expected) >= 12
    assert report["errors"] == {}
    assert report["blame"] == {} and report["offenders"] == []


@pytest.mark.parametrize("path", source_modules("core"), ids=lambda p: p.name)
def test_core_sources_import_nothing_forbidden(path):
    assert hits(imported_names(path, "batch_pipeline.core"), CORE_FORBIDDEN) == []


def test_sandbox_imports_nothing_from_core_executors_or_defs_at_runtime():
    report = probe("batch_pipeline.sandbox", SANDBOX_FORBIDDEN)
    assert report["modules"], "the sandbox package has modules"
    assert report["errors"] == {}
    assert report["blame"] == {} and report["offenders"] == []


@pytest.mark.parametrize("path", source_modules("sandbox"), ids=lambda p: p.name)
def test_sandbox_sources_import_nothing_from_core_executors_or_defs(path):
    assert hits(imported_names(path, "batch_pipeline.sandbox"), SANDBOX_FORBIDDEN) == []


def test_the_probe_can_see_a_forbidden_import():
    """The runtime probe is not blind: importing the executors does load core (the allowed direction)."""
    report = probe("batch_pipeline.executors", ["batch_pipeline.core"])
    assert report["offenders"], report


def test_module_walk_finds_every_core_file():
    found = {m.name for m in pkgutil.walk_packages([str(PACKAGE_DIR / "core")], "batch_pipeline.core.")}
    assert found == {dotted(p) for p in source_modules("core")} - {"batch_pipeline.core"}


def _runtime_requirements() -> set[str]:
    import re
    import tomllib

    project = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-") for req in project["dependencies"]}


def test_core_third_party_imports_are_runtime_dependencies():
    """Whatever core/ imports must be installed by ``pip install batch_pipeline`` (not only by the dev extra)."""
    from importlib.metadata import packages_distributions

    dists = packages_distributions()
    declared = _runtime_requirements()
    missing = {}
    for path in source_modules("core"):
        for name in imported_names(path, "batch_pipeline.core"):
            top = name.split(".")[0]
            if not top or top in sys.stdlib_module_names or top == "batch_pipeline":
                continue
            providers = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
            if not providers & declared:
                missing.setdefault(top, set()).add(path.name)
    assert missing == {}, f"imported by core/ but not in [project].dependencies: {missing}"
