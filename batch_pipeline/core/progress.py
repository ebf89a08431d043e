"""Progress of the long steps (manifest build, submission, collection) as counts, rate and ETA.

A step counts on a ``Meter``; whoever watches (the CLI's rich bar) registers a ``Progress`` sink. A caller that
knows the whole of a step (the CLI's pass over 10,000 shards) opens a meter for it with ``opened``; a step that
does a part of it (one range run) takes ``meter`` under the same task name, and its counts go to both: the part's
figures become the run's asset metadata, the whole's drive the bar. Nothing here knows Dagster or rich.

A meter is shown only once work happens (its first count): a step with nothing to do shows no bar, never "0/0".
A whole opened without a total takes its parts' totals (the manifest's bytes to read); ``expect`` adds work that
turned up on the way (a batch submitted in this pass is one more to collect), so a total is always what is known
to be there, not a guess.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Protocol


@dataclass(frozen=True)
class Figures:
    task: str
    unit: str
    done: int
    total: int | None
    elapsed_s: float
    rate_per_s: float
    eta_s: float | None  # None: no total, or no rate yet
    note: str = ""

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


class Meter:
    def __init__(
        self,
        task: str,
        total: int | None = None,
        unit: str = "items",
        *,
        parent: "Meter | None" = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task, self.total, self.unit, self.parent, self.clock = task, total, unit, parent, clock
        self.done = 0
        self.started = clock()
        self.shown = False  # shown once work happened (its first count)
        self.from_parts = False  # a whole opened without a total: its parts' totals add up to it
        self.note = ""  # a running figure beside the count (rows read while bytes are counted)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.parent is not None:
            self.parent.advance(n)
        elif n or self.shown:
            _show(self)

    def describe(self, note: str) -> None:
        """A running figure shown beside the count (``12,000 rows``); it reaches the whole too."""
        self.note = note
        if self.parent is not None:
            self.parent.describe(note)

    def set(self, done: int) -> None:
        """For sources that report a running count (rows read so far) rather than steps."""
        self.advance(done - self.done)

    def figures(self) -> Figures:
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.done / elapsed
        eta = (max(self.total - self.done, 0) / rate) if self.total is not None and rate > 0 else None
        return Figures(self.task, self.unit, self.done, self.total, elapsed, rate, eta, self.note)


class Progress(Protocol):
    def update(self, meter: Meter) -> None: ...

    def close(self, meter: Meter) -> None: ...


_sinks: list[Progress] = []
_open: dict[str, Meter] = {}


def _show(meter: Meter) -> None:
    meter.shown = True
    for sink in _sinks:
        sink.update(meter)


@contextmanager
def reporting(sink: Progress) -> Iterator[Progress]:
    """Send every meter's counts to ``sink`` while the block runs."""
    _sinks.append(sink)
    try:
        yield sink
    finally:
        _sinks.remove(sink)


@contextmanager
def opened(task: str, total: int | None, unit: str = "items") -> Iterator[Meter]:
    """The whole of a step: meters taken under ``task`` inside the block count towards it."""
    whole = Meter(task, total, unit)
    whole.from_parts = total is None
    previous = _open.get(task)
    _open[task] = whole
    try:
        yield whole
    finally:
        if previous is None:
            _open.pop(task, None)
        else:
            _open[task] = previous
        if whole.shown:  # a step that did nothing showed nothing, and closes nothing
            for sink in _sinks:
                sink.close(whole)


def meter(task: str, total: int | None = None, unit: str = "items") -> Meter:
    """A part of ``task``: its own figures, and its counts added to the whole when one is open (a whole opened
    without a total takes the parts' totals)."""
    whole = _open.get(task)
    if whole is not None and total is not None and whole.from_parts:
        whole.total = (whole.total or 0) + total
        if whole.shown:
            _show(whole)
    return Meter(task, total, unit, parent=whole)


def expect(task: str, n: int = 1) -> None:
    """``n`` more units of ``task`` turned up (a batch submitted in this pass is one more to collect)."""
    whole = _open.get(task)
    if whole is not None:
        whole.total = (whole.total or 0) + n
        if whole.shown:
            _show(whole)
