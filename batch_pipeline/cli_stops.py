"""What the command line says when a job stops, and the exit code it returns.

An expected stop (a bad key, the budget, the canary, the retry-spend cap, a failed blocking check, a pause) is a
decision for a human: the CLI prints one line saying why and one line with the command that fixes it, and exits 3.
Stack traces are for bugs: while a run goes, Dagster's console log (which writes to ``sys.stderr``) is held, dropped
on an expected stop (it stays in the Dagster run log) and shown on a bug (exit 1).
"""

import re
import sys
import tempfile
from dataclasses import dataclass
from enum import IntEnum
from typing import IO, Self

from batch_pipeline.core.troubleshooting import TroubleKind, for_stop, lookup


class ExitCode(IntEnum):
    """The documented exit codes of every ``batch-pipeline`` command (README, "Exit codes")."""

    DONE = 0
    BUG = 1  # an unexpected error: the stack trace is printed
    BAD_INPUT = 2  # a job spec, setting, price table or argument is wrong; or the job has nothing to show yet
    STOPPED = 3  # stopped for a human: bad key, budget, canary, retry cap, failed check, pause, incomplete job
    INTERRUPTED = 143  # SIGTERM during a run (128 + SIGTERM): finished results were stored


@dataclass(frozen=True)
class Advice:
    """A stop reason's meaning and the fix (``<job>`` and "the spec" are filled in by ``fix_line``)."""

    means: str
    fix: str


# stops the command line names that are not rows of the troubleshooting table (core/troubleshooting.py)
CLI_STOPS: dict[str, Advice] = {
    "check_failed": Advice(
        "a blocking quality check failed: the validated table was not published",
        "see `batch-pipeline report <job>` and `batch-pipeline status <job> --check`; fix what "
        "the check names, then `batch-pipeline resume <job>`",
    ),
    "bad_input": Advice(
        "a job spec, setting or input file is wrong (the message names it)",
        "correct what the message names, then `batch-pipeline resume <job>`",
    ),
}


def advice(code: str | None) -> Advice:
    """The troubleshooting row of a stop code, wait kind (``paused``) or check name; a provider's own code gets
    the generic provider row."""
    if code in CLI_STOPS:
        return CLI_STOPS[code]
    row = lookup(code) if code else None
    if row is None or row.kind == TroubleKind.WARNING_CHECK:
        row = for_stop(code)
    return Advice(row.meaning, row.fix)


def fix_line(code: str | None, job: str, spec: str) -> str:
    return "fix: " + advice(code).fix.replace("<job>", job).replace("in the spec", f"in {spec}")


def one_line(text: str, limit: int = 600) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


_CHECK_FAILED = re.compile(r"\bcheck \S+ failed|\bnot promoting\b")
_CHECK_NAME = re.compile(r"\bcheck (\w+) failed")
_OVER_BUDGET = re.compile(r"\bQuoteRefused: .*exceeds budget_usd")
_BAD_INPUT = re.compile(r"\b(ConfigError|InputError|QuoteRefused): ")


def classify_failure(description: str | None) -> tuple[ExitCode, str | None]:
    """A failed run that recorded no stop: a failed blocking check (its name is the code) or a quote over budget
    (a human decides, exit 3), a spec or input error raised inside a step (exit 2), or else a bug (exit 1). The
    step names the error class in the failure's description (``Type: message``)."""
    text = description or ""
    if _CHECK_FAILED.search(text):
        named = [c for c in _CHECK_NAME.findall(text) if lookup(c) is not None]
        return ExitCode.STOPPED, named[0] if named else "check_failed"
    if _OVER_BUDGET.search(text):
        return ExitCode.STOPPED, "budget"
    if _BAD_INPUT.search(text):
        return ExitCode.BAD_INPUT, "bad_input"
    return ExitCode.BUG, None


class HeldStderr:
    """Hold what is written to ``sys.stderr`` while a run goes; ``release()`` shows it, ``discard()`` drops it.

    Leaving the block on an exception not in ``expected`` releases it (a bug's trace is shown). ``active=False``
    (a verbose ``--log-level``) lets it through live.
    """

    def __init__(self, *, active: bool = True, expected: tuple[type[BaseException], ...] = ()) -> None:
        self.active, self.expected = active, expected
        self._held: IO[str] | None = None
        self._real: IO[str] | None = None

    def __enter__(self) -> Self:
        if self.active:
            self._held = tempfile.SpooledTemporaryFile(max_size=1 << 20, mode="w+", encoding="utf-8")
            self._real, sys.stderr = sys.stderr, self._held  # type: ignore[assignment]
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._real is not None:
            sys.stderr, self._real = self._real, None
        if exc_type is not None and not issubclass(exc_type, self.expected):
            self.release()

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.seek(0)
            sys.stderr.write(held.read())
            sys.stderr.flush()
            held.close()

    def discard(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()
