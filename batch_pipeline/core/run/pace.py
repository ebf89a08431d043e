"""How long to wait before polling a batch again: the configured interval while the batch moves, longer while it
sits in one state.

Every poll is a request and a response parsed through the provider's SDK (~2-3 ms of CPU on the sandbox). A run
waiting on long batches polled each one at the same rate all the way: on the sandbox (0.2 s), with the live
display, that was ~0.03 CPU s per second of waiting, 112 CPU s an hour (``benchmarks/wait_bench.py``). Now each
poll that finds the batch where it was stretches the next wait by ``POLL_GROWTH``, up to ``POLL_MAX_FACTOR`` times
the interval; a change of state (validating, running, finalizing) brings it back to the interval, so a batch is
seen ending within ``POLL_MAX_FACTOR`` intervals (2 minutes at the providers' default 30 s).
"""

from batch_pipeline.core.ledger.executor import BatchState

POLL_GROWTH = 1.25
POLL_MAX_FACTOR = 4.0


class PollPace:
    """The waits between one batch's polls: ``after(state)`` once per poll."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.wait_s = interval_s
        self.state: BatchState | None = None

    def after(self, state: BatchState) -> float:
        """The wait before the next poll, given the state this poll found."""
        if state != self.state:
            self.state, self.wait_s = state, self.interval_s
        else:
            self.wait_s = min(self.wait_s * POLL_GROWTH, self.interval_s * POLL_MAX_FACTOR)
        return self.wait_s
