"""What every provider batch executor is, whichever provider: its settings, how often it polls, how many threads
parse its results, how long the provider keeps them, and the queue its batches wait in (``QueueCapped``)."""

from typing import Any

from batch_pipeline.core.run.threads import default_workers
from batch_pipeline.core.spec.quota import Retention
from batch_pipeline.executors.quota import QueueCapped


class BatchBackend(QueueCapped):
    """The base of the OpenAI, Azure, Anthropic, Bedrock, Gemini and Vertex AI batch executors."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.poll_interval_s = settings.poll_interval()
        self.parse_workers = settings.parse_workers or default_workers()

    @property
    def retention(self) -> Retention:
        """How long the provider keeps a batch's results (``backend.settings.retention``)."""
        return self.settings.retention
