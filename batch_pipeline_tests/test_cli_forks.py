"""The tests' forked `batch-pipeline` processes (``cli_forks``) behave as cold ones: output, exit code, environment,
working directory, signals and sessions; and nothing the fork server imported reads the environment on import."""

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from batch_pipeline.core.settings import PROJECT_ROOT


def _cold(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "batch_pipeline.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("args", [["--help"], ["run", "nojob"], ["run", "nojob", "--no-such-flag"]])
def test_a_fork_answers_as_a_cold_start_does(cli, tmp_path, args):
    """Same exit code, stdout and stderr; the error names the working directory's home and the environment's jobs
    folder, so the child took both from its request, not from the server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATCH_PIPELINE_", "DAGSTER_"))}
    env.update(BATCH_PIPELINE_JOBS=str(tmp_path / "jobs_here"), COLUMNS="120")
    forked = cli.run(args, env=env, cwd=tmp_path, timeout=120)
    cold = _cold(args, env, tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    if args[0] == "run" and len(args) == 2:
        assert forked.returncode == 2
        assert str(tmp_path / ".batch_pipeline" / "jobs" / "nojob") in forked.stderr
        assert str(tmp_path / "jobs_here" / "nojob.yaml") in forked.stderr


def test_a_fork_is_its_own_process_and_dies_by_the_signal_sent(cli, tmp_path):
    proc = cli.popen(["sandbox", "--port", "0"], env=dict(os.environ), cwd=tmp_path, start_new_session=True)
    try:
        assert proc.pid not in (os.getpid(), os.getppid())
        assert os.getpgid(proc.pid) == proc.pid  # start_new_session: the leader of its own group
        assert proc.stdout.readline().startswith("SANDBOX READY http://127.0.0.1:")  # serving, in the fork
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.communicate()


def _reads_environment(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
        return isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id in ("environ", "getenv")


def environment_reads_on_import(root: Path) -> list[str]:
    """``file:line`` of each read of the environment that runs when the module is imported (outside a function)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        stack: list[ast.AST] = list(tree.body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue  # runs when called; its decorators and defaults still run on import
            if _reads_environment(node):
                found.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno}")
            stack.extend(ast.iter_child_nodes(node))
    return found


# Set on import on purpose: OpenBLAS reads it once, when numpy is first imported (in the fork server, once for all
# its forks), so no command could change it later anyway (batch_pipeline/__init__.py says why it is set).
SET_ON_IMPORT = {"batch_pipeline/__init__.py": 'os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")'}


def _set_on_purpose(where: str) -> bool:
    file, line = where.rsplit(":", 1)
    wanted = SET_ON_IMPORT.get(file)
    return wanted is not None and wanted in (PROJECT_ROOT / file).read_text().splitlines()[int(line) - 1]


def test_no_module_reads_the_environment_when_imported(tmp_path):
    """The fork server imports the package once with its own environment; a read on import would keep that one."""
    found = environment_reads_on_import(PROJECT_ROOT / "batch_pipeline")
    assert sum(map(_set_on_purpose, found)) == len(SET_ON_IMPORT)
    assert [f for f in found if not _set_on_purpose(f)] == []
    planted = tmp_path / "batch_pipeline" / "deep.py"  # the check sees one
    planted.parent.mkdir()
    planted.write_text("import os\nHOME = os.environ.get('X')\ndef f():\n    return os.getenv('Y')\n")
    assert environment_reads_on_import(tmp_path / "batch_pipeline") == ["batch_pipeline/deep.py:2"]
