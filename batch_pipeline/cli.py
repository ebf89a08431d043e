"""`batch-pipeline`: run a job spec through Dagster, show a job's reconciliation, serve the sandbox.

    batch-pipeline run data/jobs/demo.yaml     # manifest -> quote -> shards -> validated table
    batch-pipeline status demo                 # per-shard reconciliation from the store, a stop and its fix
    batch-pipeline quote demo --compare        # the whole job (and what remains) on every backend
    batch-pipeline export demo --format csv    # the validated table as openai-batch, parquet, csv or jsonl
    batch-pipeline report demo                 # the report table and the path of its plot

A job is named by its spec's path or by its name. Exit codes: 0 done, 1 a bug, 2 bad input or configuration,
3 stopped for a human (the fix is printed), 143 interrupted by SIGTERM.
    batch-pipeline sandbox --port 8765         # the provider sandbox alone
    batch-pipeline dev                         # sandbox + `dagster dev` on the same instance
"""

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Self

from rich.console import Console

from batch_pipeline.cli_home import dagster_home as _dagster_home
from batch_pipeline.cli_home import dagster_instance as _dagster_instance
from batch_pipeline.cli_jobs import cli_settings, remember_spec, resolve_job
from batch_pipeline.cli_outputs import add_output_commands, print_summary
from batch_pipeline.cli_progress import RunProgress
from batch_pipeline.cli_quote import add_quote_command
from batch_pipeline.cli_state import add_commands
from batch_pipeline.cli_stops import (
    ExitCode,
    HeldStderr,
    classify_failure,
    fix_line,
    one_line,
)
from batch_pipeline.core.errors import BatchPipelineError, SystemicError
from batch_pipeline.core.ledger.control import JobPaused
from batch_pipeline.core.run.heap import frozen_heap
from batch_pipeline.core.settings import PROJECT_ROOT
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.process_exit import no_collection_at_exit

if TYPE_CHECKING:
    from batch_pipeline.core.store import Store

SANDBOX_URL_ENV = "BATCH_PIPELINE_SANDBOX_URL"
# messages keep paths and fields on one line; tables get room when the output is not a terminal (CI logs, pipes)
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
errors = Console(stderr=True, soft_wrap=True, highlight=False)  # stops and errors: one line each, on stderr


def _needs_sandbox(spec: JobSpec) -> bool:
    return bool(spec.backend.settings.get("sandbox")) and not os.environ.get(SANDBOX_URL_ENV)


@contextmanager
def _sandbox_if_needed(spec: JobSpec | None, force: bool = False):
    """Start the bundled sandbox for jobs that use it (unless one is already configured); stop it after."""
    if not force and (spec is None or not _needs_sandbox(spec)):
        yield None
        return
    from batch_pipeline.sandbox import start_sandbox_process, stop_sandbox_process

    proc, url = start_sandbox_process(0)
    os.environ[SANDBOX_URL_ENV] = url
    console.print(f"[dim]sandbox (no key, no cost) serving the OpenAI Batch API at {url} (pid {proc.pid})[/dim]")
    try:
        yield url
    finally:
        stop_sandbox_process(proc)
        os.environ.pop(SANDBOX_URL_ENV, None)


class _TermAsInterrupt:
    """While a run goes (main thread only): SIGTERM interrupts it as Ctrl-C does, and ``received`` says it came.

    Our handler raises ``KeyboardInterrupt`` in the main thread. While Dagster executes it maps SIGTERM onto its
    own SIGINT handling (its interrupt is raised inside the step, so a stream shard stores the finished results it
    holds, and the run then ends as failed instead of raising). The signal is therefore also watched through the
    wakeup fd, whichever handler takes it; once it came, Dagster's console log (the interrupted step's stack) is
    muted. Read ``received`` after leaving the context.

    A process started with SIGINT ignored (a script's background job, ``cmd &``) would lose SIGTERM as well: after
    each run Dagster sets SIGTERM to SIGINT's handler, SIG_IGN, and an ignored signal never reaches the wakeup fd, so
    a supervisor's stop did nothing until SIGKILL. SIGINT therefore gets Python's own handler while the run goes.
    """

    def __init__(self) -> None:
        self.received = False
        self._active = False
        self._stderr = None
        self._ignored_int = False

    def __enter__(self) -> Self:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._previous = signal.signal(signal.SIGTERM, self._interrupt)
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            self._ignored_int = True
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self._watcher = threading.Thread(target=self._watch, name="sigterm-watch", daemon=True)
        self._watcher.start()
        self._active = True
        return self

    def _interrupt(self, signum, frame) -> None:
        self.received = True
        raise KeyboardInterrupt

    def _watch(self) -> None:
        while data := self._reader.recv(64):
            if signal.SIGTERM in data:
                self.received = True
                if self._stderr is None:  # Dagster's console logger writes to sys.stderr as it is at each record
                    self._stderr, sys.stderr = sys.stderr, open(os.devnull, "w")
            if 0 in data:  # our own wake-up: the run is over
                return

    def __exit__(self, *exc) -> None:
        if not self._active:
            return
        self._active = False
        signal.set_wakeup_fd(self._previous_fd)
        # Dagster may have remapped SIGTERM meanwhile; whichever handler it has now, ours ends here
        signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
        if self._ignored_int:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._writer.send(b"\0")
        self._watcher.join(timeout=5)
        self._reader.close()
        self._writer.close()
        if self._stderr is not None:
            muted, sys.stderr, self._stderr = sys.stderr, self._stderr, None
            muted.close()


def _interrupted(spec_arg: str) -> int:
    console.print(
        f"interrupted: finished results were stored; resume with `batch-pipeline run {spec_arg}`",
        markup=False,
        highlight=False,
    )
    return ExitCode.INTERRUPTED


def _stopped(spec: JobSpec, arg: str, reason: str, code: str | None) -> int:
    """An expected stop: one line saying why, one with the command that fixes it (stderr), exit 3."""
    errors.print(f"job {spec.name} stopped ({code or 'stop'}): {one_line(reason)}", markup=False)
    errors.print(fix_line(code, spec.name, spec.source_path or arg), markup=False)
    return ExitCode.STOPPED


def _resume(control):
    """A run resumes the job: a pause, a stop and held shards are lifted, each said on one line."""
    held = control.unpause()
    if held:
        console.print(f"[yellow]resuming: the job was paused at {held.at} ({held.reason})[/yellow]")
    stopped = control.clear()
    if stopped:
        console.print(f"[yellow]resuming: the job was stopped at {stopped.at}: {stopped.reason}[/yellow]")
    released = control.release_holds()
    if released:
        console.print(
            f"[yellow]resuming: shard(s) {', '.join(released)} were held (results lost at the provider); "
            "their items are sent again[/yellow]"
        )
    return control


def _nothing_to_do(spec: JobSpec, store: "Store", prices: Path | None, started: float) -> int | None:
    """A finished job run again (``core/publish/noop.py``): its published report, printed without starting Dagster
    (no manifest generation, no run, no item or result read); None when the run has anything to do."""
    from datetime import datetime

    from batch_pipeline.core.publish.noop import nothing_to_do

    report = nothing_to_do(spec, store, prices)
    if report is None:
        return None
    remember_spec(spec, store)
    at = datetime.fromisoformat(report["published_at"]).isoformat(timespec="seconds")
    console.print(
        f"[bold]>[/bold] nothing to do: no input changed, every shard is settled and nothing changed since the "
        f"publish at {at}: the published tables stand"
    )
    report["passes"] = 0
    report["wall_time_s"] = round(time.perf_counter() - started, 2)
    print_summary(report, console)
    return ExitCode.DONE if report.get("complete") else ExitCode.STOPPED


def cmd_run(args: argparse.Namespace) -> int:
    from batch_pipeline.core.store import Store

    settings = args.settings
    spec = resolve_job(args.spec, settings)
    os.environ["BATCH_PIPELINE_HOME"] = settings.home  # any child process (a sandbox, a step pod) reads it
    console.print(f"[bold]job {spec.name}[/bold]: {spec.model} on {spec.backend.name}, input {spec.input.path}")
    store = Store.of(settings)
    started = time.perf_counter()
    done = _nothing_to_do(spec, store, settings.prices, started)
    if done is not None:
        return done
    _dagster_home()
    import dagster as dg

    from batch_pipeline.defs.pipeline import run_job
    from batch_pipeline.defs.resources import resources_of

    resources = resources_of(settings)
    from batch_pipeline.core.ledger.control import JobControl, JobPaused

    remember_spec(spec, store)
    control = _resume(JobControl(store, spec.name))
    term = _TermAsInterrupt()  # SIGTERM: a stream shard stores what finished, then we exit 143 (no traceback)
    # Dagster's console log (stack traces included) is shown for bugs only; a verbose level shows it live
    log = HeldStderr(
        active=logging.getLevelName(args.log_level.upper()) in (logging.WARNING, logging.ERROR),
        expected=(dg.Failure, JobPaused, KeyboardInterrupt),
    )
    try:
        with (
            log,
            term,
            _sandbox_if_needed(spec),
            _dagster_instance() as instance,
            RunProgress(spec, store, console) as progress,
            frozen_heap(),  # what the run starts with stays out of the collector's full passes (core/run/heap.py)
        ):
            report = run_job(
                spec, instance, resources, settings=settings, log_level=args.log_level, on_stage=progress.set_stage
            )
    except dg.Failure as exc:
        if term.received:
            log.discard()
            return _interrupted(args.spec)
        stop = control.current()
        if stop is not None:  # an expected stop recorded by the run (bad key, budget, canary, retry cap, ...)
            log.discard()
            return _stopped(spec, args.spec, stop.reason, stop.code)
        exit_code, code = classify_failure(exc.description)
        if exit_code != ExitCode.BUG:  # a failed check, a quote over budget, a bad spec or input
            log.discard()
            _stopped(spec, args.spec, exc.description or "run failed", code)
            return exit_code
        log.release()  # not a stop the job decided: a bug; Dagster's log above has the stack trace
        errors.print(f"job {spec.name} failed: {one_line(exc.description or 'run failed')}", markup=False)
        errors.print(
            f"this looks like a bug (the stack trace is above and in the Dagster run log); once fixed, "
            f"`batch-pipeline resume {spec.name}` continues where it stopped"
        )
        return ExitCode.BUG
    except JobPaused as exc:
        log.discard()
        return _stopped(spec, args.spec, str(exc), "paused")
    except KeyboardInterrupt:
        if term.received:
            log.discard()
            return _interrupted(args.spec)
        log.release()
        raise
    log.release()
    report["wall_time_s"] = round(time.perf_counter() - started, 2)
    print_summary(report, console)
    return ExitCode.DONE if report.get("complete") else ExitCode.STOPPED


def cmd_sandbox(args: argparse.Namespace) -> int:
    """The sandbox in this process (no child to leak): SIGTERM and Ctrl-C stop its server and exit 0. Every flag
    of `python -m batch_pipeline.sandbox` is passed through to it."""
    from batch_pipeline.sandbox.__main__ import main as sandbox_main

    argv = ["--port", str(args.port), "--host", args.host]
    for flag, value in (
        ("--scenario", args.scenario),
        ("--scenario-params", args.scenario_params),
        ("--state-dir", args.state_dir),
        ("--s3-url", args.s3_url),
    ):
        if value:
            argv += [flag, value]
    for item in args.param:
        argv += ["--param", item]
    return sandbox_main(argv + (["--verbose"] if args.verbose else []))


def cmd_dev(args: argparse.Namespace) -> int:
    """The sandbox and `dagster dev`; on SIGTERM or Ctrl-C every process they started is stopped by PID."""
    from batch_pipeline.cli_procs import start_in_session, stop_tree, term_as_interrupt

    home = _dagster_home()
    os.environ["BATCH_PIPELINE_HOME"] = args.settings.home
    with term_as_interrupt(), _sandbox_if_needed(None, force=not os.environ.get(SANDBOX_URL_ENV)):
        console.print(f"dagster dev on http://127.0.0.1:{args.port} (DAGSTER_HOME={home})")
        dagster = start_in_session(
            [
                sys.executable,
                "-m",
                "dagster",
                "dev",
                "-h",
                "127.0.0.1",
                "-p",
                str(args.port),
                "-w",
                str(PROJECT_ROOT / "workspace.yaml"),
            ],
            cwd=PROJECT_ROOT,
        )
        try:
            return dagster.wait()
        except KeyboardInterrupt:
            console.print("stopping dagster dev and everything it started")
            stop_tree(dagster)
            return ExitCode.DONE
        finally:
            if dagster.poll() is None:
                stop_tree(dagster)


def main(argv: list[str] | None = None) -> int:
    no_collection_at_exit()  # the exit skips the interpreter's last full collections (process_exit.py)
    parser = argparse.ArgumentParser(
        prog="batch-pipeline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run a job spec end to end through Dagster")
    p.add_argument("spec", help="path to a job spec YAML, or a job name in data/jobs/")
    p.add_argument("--home", help="storage root (default $BATCH_PIPELINE_HOME or ./.batch_pipeline)")
    p.add_argument("--log-level", default="WARNING", help="Dagster console log level (default WARNING)")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("resume", help="same as run: clears a job stop and continues where it stopped")
    p.add_argument("spec", help="path to a job spec YAML, or a job name in data/jobs/")
    p.add_argument("--home")
    p.add_argument("--log-level", default="WARNING")
    p.set_defaults(fn=cmd_run)
    add_commands(sub, resolve_job, console)
    add_output_commands(sub, console)
    add_quote_command(sub, console)
    p = sub.add_parser("sandbox", help="serve the provider sandbox on loopback")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--scenario", help="server-wide scenario (see batch_pipeline/sandbox/README.md)")
    p.add_argument("--scenario-params", help="JSON object of scenario params")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a scenario param, repeatable (e.g. --param quota_enqueued_tokens=2000000)",
    )
    p.add_argument("--host", default="127.0.0.1", help="127.0.0.1 or localhost")
    p.add_argument("--state-dir", help="persist the sandbox's state here")
    p.add_argument("--s3-url", help="the S3 endpoint Bedrock jobs use (default: a moto server it starts)")
    p.add_argument("--verbose", action="store_true", help="log every request on stderr")
    p.set_defaults(fn=cmd_sandbox)
    p = sub.add_parser("dev", help="start the sandbox and `dagster dev` on the local instance")
    p.add_argument("--port", type=int, default=3000)
    p.set_defaults(fn=cmd_dev)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args.settings = cli_settings(getattr(args, "home", None))  # the edge: one Settings, handed to the command
        return int(args.fn(args))
    except (SystemicError, JobPaused) as exc:  # stopped for a human, outside a run
        errors.print(f"stopped: {one_line(str(exc))}", markup=False)
        return ExitCode.STOPPED
    except BatchPipelineError as exc:  # a spec, setting or argument is wrong
        errors.print(f"[red]error:[/red] {exc}")
        return ExitCode.BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
