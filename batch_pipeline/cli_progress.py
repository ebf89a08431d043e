"""The CLI run's live display: a status line over what the run did, and a bar per step that has work."""

import threading

from rich.console import Console
from rich.progress import BarColumn, SpinnerColumn, TaskID, TextColumn
from rich.progress import Progress as RichProgress

from batch_pipeline.core import progress
from batch_pipeline.core.run.activity import Activity
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.spec.paths import JobPaths

STATUS_EVERY_S = 1.0  # the status line lists the job's result parts: once a second, not at every redraw


def _amount(n: float, unit: str) -> str:
    return f"{n / 1e6:,.1f}" if unit == "bytes" else f"{n:,.0f}"


def bar_fields(f: progress.Figures, final: bool = False) -> dict[str, str]:
    """What a step's bar says: done of its total (bytes as MB), the rate, and the ETA (the time taken once done)."""
    unit = "MB" if f.unit == "bytes" else f.unit
    total = f.total if f.total is not None else (f.done if final else None)
    count = _amount(f.done, f.unit) + (f"/{_amount(total, f.unit)}" if total is not None else "") + f" {unit}"
    rate = f"{_amount(f.rate_per_s, f.unit) if f.unit == 'bytes' else f'{f.rate_per_s:,.1f}'} {unit}/s"
    rate += f", {f.note}" if f.note else ""
    eta = f"{f.elapsed_s:,.1f} s" if final else f"ETA {f.eta_s:,.0f} s" if f.eta_s is not None else ""
    return {"count": count, "rate": rate, "eta": eta}


class RunProgress:
    """The run's live display: a status line that watches the store (what this run sent, collected and answered,
    result parts), and a bar per step that has work (``core.progress`` meters: manifest bytes read, shards
    submitted, batches collected) with counts, rate and ETA."""

    def __init__(self, spec: JobSpec, store, console: Console) -> None:
        self.spec, self.store, self.stage, self.console = spec, store, "starting", console
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._bars = RichProgress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[eta]}"),
            console=console,
            # redrawn 4 times a second on a terminal; elsewhere (a log file, a pipe) only the final state is
            # printed, so nothing is rendered while the run goes on: rich's 10 Hz refresh built the whole table
            # each time, ~0.07 CPU s per 10 s of a run that waits on its provider
            auto_refresh=console.is_terminal,
            refresh_per_second=4,
        )
        self._status = self._bars.add_task("starting", total=None, count="", rate="", eta="")
        self._tasks: dict[int, TaskID] = {}

    def __enter__(self):
        # what is there before the run starts: the status line counts only what this run does
        self._paths = JobPaths(self.spec.name)
        self._activity = Activity(self.store, self.spec.name, self.spec.tail.backend.name if self.spec.tail else None)
        self._parts_before = set(self._parts())
        self._bars.__enter__()
        self._reporting = progress.reporting(self)
        self._reporting.__enter__()
        if self.console.is_terminal:  # elsewhere nothing is drawn before the end, so the line is made once there
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._bars.update(self._status, description=self.status_line())
        self._reporting.__exit__(*exc)
        self._bars.__exit__(*exc)

    def update(self, meter: progress.Meter) -> None:
        f = meter.figures()
        fields = bar_fields(f)
        task = self._tasks.get(id(meter))
        if task is None:
            task = self._tasks[id(meter)] = self._bars.add_task(meter.task, total=f.total, **fields)
        self._bars.update(task, completed=f.done, total=f.total, **fields)

    def close(self, meter: progress.Meter) -> None:
        task = self._tasks.pop(id(meter), None)
        if task is not None:
            self._finish(task, meter)

    def _finish(self, task: TaskID, meter: progress.Meter) -> None:
        f = meter.figures()
        self._bars.update(
            task, completed=f.done, total=f.total if f.total is not None else f.done, **bar_fields(f, final=True)
        )
        self._bars.stop_task(task)

    def set_stage(self, stage: str) -> None:
        self.console.print(f"[bold]>[/bold] {stage}")
        self.stage = stage
        self._bars.update(self._status, description=stage)

    def _loop(self) -> None:
        while not self._stop.wait(STATUS_EVERY_S):
            self._bars.update(self._status, description=self.status_line())

    def status_line(self) -> str:
        """The stage and what this run did so far (events since it started, never the job's whole history)."""
        try:
            did = self._activity.since()
            parts = len(set(self._parts()) - self._parts_before)
        except OSError:
            return self.stage
        if not did.anything and not parts:
            return self.stage
        return f"{self.stage}: {did.describe()}; {parts} result part(s) written"

    def _parts(self) -> list[str]:
        try:
            return self.store.list_files(self._paths.results, recursive=True, suffix=".parquet")
        except (FileNotFoundError, OSError):
            return []
