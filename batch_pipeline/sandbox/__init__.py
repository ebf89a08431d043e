"""A local emulator of the OpenAI Files + Batches API: deterministic, clock-driven, loopback only.

``SandboxServer(port=0).start()`` runs it on a thread; ``start_sandbox_process()`` runs it as a child process;
``python -m batch_pipeline.sandbox`` serves it from the command line. See README.md in this directory.
"""

from batch_pipeline.sandbox.admin_client import SandboxAdmin
from batch_pipeline.sandbox.http_server import SandboxServer
from batch_pipeline.sandbox.process import start_sandbox_process, stop_sandbox_process
from batch_pipeline.sandbox.scenarios import Scenario, make_scenario

__all__ = [
    "SandboxAdmin",
    "SandboxServer",
    "Scenario",
    "make_scenario",
    "start_sandbox_process",
    "stop_sandbox_process",
]
