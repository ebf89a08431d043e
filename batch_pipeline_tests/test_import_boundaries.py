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


# what a process that loads the code location (its code server, its daemon, each run worker, each CLI run) does not
# import until a step needs it: pandera and hypothesis (~0.15 s; a publish's gate), pandas (~0.2 s; brought by
# `pyarrow.dataset` and by `Schema.empty_table()`: DuckDB's scans at publish), matplotlib (~0.3 s; the report's plot)
LEFT_FOR_THE_STEP = ("pandera", "pandas", "pyarrow.dataset", "matplotlib")


def test_loading_the_code_location_leaves_the_heavy_step_libraries_out():
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, batch_pipeline.definitions; print([m for m in {LEFT_FOR_THE_STEP!r} if m in sys.modules])",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PACKAGE_DIR.parent,
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip().splitlines()[-1] == "[]"


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


# -- inside core: the layers of batch_pipeline/core/__init__.py ------------------------------------------------
def core_imports(root: Path) -> dict[str, set[tuple[str, bool]]]:
    """For each module of the core tree at ``root``: the core modules it imports, each with whether the import sits
    under ``if TYPE_CHECKING:`` (a hint only, never run). Imports inside functions count like any other."""
    out: dict[str, set[tuple[str, bool]]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        module = ".".join(("batch_pipeline", "core", *parts))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        hinted = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for stmt in block.body
            for node in ast.walk(stmt)
        }
        found = out.setdefault(module, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = imported_names_of(node, package)
                found.update((n, id(node) in hinted) for n in names if n.startswith("batch_pipeline.core."))
    return out


def imported_names_of(node: ast.Import | ast.ImportFrom, package: str) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    return {mod} | {f"{mod}.{alias.name}" for alias in node.names}


def part_of(module: str) -> str:
    """``batch_pipeline.core.run.runner`` -> ``run``; ``batch_pipeline.core.errors`` -> ``errors``."""
    return module.split(".")[2]


def upward_imports(root: Path, layers: tuple[str, ...]) -> list[str]:
    """Every import from a part of core to a part above it, and every part that is not in the layer list."""
    floor = {name: i for i, name in enumerate(layers)}
    problems = []
    for module, imports in core_imports(root).items():
        if module == "batch_pipeline.core":
            continue
        mine = part_of(module)
        if mine not in floor:
            problems.append(f"{module}: its part {mine!r} is in no layer of core/__init__.py LAYERS")
            continue
        for name, _ in sorted(imports):
            theirs = part_of(name)
            if theirs in floor and floor[theirs] > floor[mine]:
                problems.append(f"{module} imports {name}: {theirs} is above {mine}")
    return problems


def import_circles(root: Path) -> list[list[str]]:
    """Circles of core files importing each other (hints under TYPE_CHECKING apart), by Tarjan's algorithm."""
    imports = core_imports(root)
    graph = {
        m: {n for n, hint in names if not hint and n in imports and n != m and not n.endswith(".__init__")}
        for m, names in imports.items()
    }
    graph = {m: {n for n in edges if imports.get(n) is not None and n.count(".") >= 2} for m, edges in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            circle = []
            while True:
                w = stack.pop()
                circle.append(w)
                if w == v:
                    break
            if len(circle) > 1:
                circles.append(sorted(circle))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def package_inits(root: Path) -> set[str]:
    return {".".join(("batch_pipeline", "core", *p.relative_to(root).parent.parts)) for p in root.rglob("__init__.py")}


def test_core_imports_down_its_layers_only():
    from batch_pipeline.core import LAYERS

    parts = {p.name if p.is_dir() else p.stem for p in (PACKAGE_DIR / "core").iterdir() if p.name != "__pycache__"}
    parts -= {"__init__"}
    assert parts == set(LAYERS), f"parts of core and LAYERS differ: {sorted(parts ^ set(LAYERS))}"
    assert upward_imports(PACKAGE_DIR / "core", LAYERS) == []


def test_no_two_core_files_import_each_other_in_a_circle():
    assert import_circles(PACKAGE_DIR / "core") == []


def test_the_layer_check_fails_on_a_planted_upward_import(tmp_path):
    """A copy of core with one planted module, ``spec/planted.py`` importing the publish part (inside a function,
    where a runtime probe would never see it): the check names it; the copy without it passes."""
    import shutil

    from batch_pipeline.core import LAYERS

    root = tmp_path / "core"
    shutil.copytree(PACKAGE_DIR / "core", root, ignore=shutil.ignore_patterns("__pycache__"))
    assert upward_imports(root, LAYERS) == [] and import_circles(root) == []
    (root / "spec" / "planted.py").write_text(
        "def later():\n    from batch_pipeline.core.publish.tables import stage\n\n    return stage\n"
    )
    assert upward_imports(root, LAYERS) == [
        "batch_pipeline.core.spec.planted imports batch_pipeline.core.publish.tables: publish is above spec",
        "batch_pipeline.core.spec.planted imports batch_pipeline.core.publish.tables.stage: publish is above spec",
    ]
    (root / "spec" / "planted.py").unlink()
    (root / "extra").mkdir()
    (root / "extra" / "__init__.py").write_text("")
    assert upward_imports(root, LAYERS) == [
        "batch_pipeline.core.extra: its part 'extra' is in no layer of core/__init__.py LAYERS"
    ]


def test_the_circle_check_finds_a_planted_circle(tmp_path):
    """Two planted modules of one part that import each other, one of them inside a function, are a circle; a
    ``TYPE_CHECKING`` hint back is not."""
    root = tmp_path / "core"
    (root / "spec").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "spec" / "__init__.py").write_text("")
    (root / "spec" / "a.py").write_text("from batch_pipeline.core.spec.b import B\n")
    (root / "spec" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from batch_pipeline.core.spec.a import A\nB = 1\n"
    )
    assert import_circles(root) == []
    (root / "spec" / "b.py").write_text("def later():\n    from batch_pipeline.core.spec.a import A\n\n    return A\n")
    assert import_circles(root) == [["batch_pipeline.core.spec.a", "batch_pipeline.core.spec.b"]]
