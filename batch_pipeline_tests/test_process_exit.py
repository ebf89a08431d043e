"""The project's processes exit with their heap frozen: the interpreter's last collections skip it.

Each check is a fresh interpreter that registers a probe first (``atexit`` runs handlers last-registered first, so
the probe runs after everything the project registered) and prints what the exit's collector will see.
"""

import subprocess
import sys

import pytest

PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
{work}
"""
# a cycle alive at exit with a finalizer: the interpreter's last collections find it and finalize it, unless frozen
CYCLE = """
class Cycle:
    def __init__(self):
        self.me = self
    def __del__(self):
        print("cycle finalized", flush=True)
keep = Cycle()
"""


def exit_output(work: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(work=work)], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_process_that_asked_for_it_exits_without_walking_its_heap():
    out = exit_output(CYCLE + "from batch_pipeline.process_exit import no_collection_at_exit\nno_collection_at_exit()")
    assert "frozen at exit: True" in out
    assert "cycle finalized" not in out


def test_a_process_that_did_not_ask_walks_its_heap_at_exit():
    out = exit_output(CYCLE + "import batch_pipeline.process_exit")  # imported alone, it registers nothing
    assert "frozen at exit: False" in out
    assert "cycle finalized" in out


def test_asking_twice_registers_one_freeze():
    work = "import atexit\nfrom batch_pipeline.process_exit import no_collection_at_exit\n"
    work += "no_collection_at_exit()\nno_collection_at_exit()\nprint('handlers', atexit._ncallbacks())"
    once = "import atexit\nfrom batch_pipeline.process_exit import no_collection_at_exit\n"
    once += "no_collection_at_exit()\nprint('handlers', atexit._ncallbacks())"
    assert exit_output(work).splitlines()[0] == exit_output(once).splitlines()[0]


@pytest.mark.parametrize(
    "work",
    [
        "import batch_pipeline.definitions",  # every Dagster code server and run worker loads the code location
        "from batch_pipeline.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
        "from batch_pipeline.sandbox.__main__ import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
    ],
    ids=["code_location", "cli", "sandbox"],
)
def test_each_entry_point_exits_frozen(work):
    assert "frozen at exit: True" in exit_output(work)
