"""``backend.settings`` of ``anthropic_batch``, apart from its executor: the registry reads it when a code location
loads (each job's Dagster pool), and the ``anthropic`` SDK costs ~1 s to import."""

from pydantic import Field

from batch_pipeline.executors.settings import BatchProviderSettings


class AnthropicBatchSettings(BatchProviderSettings):
    """``backend.settings`` of ``anthropic_batch``. The key is read from the environment, never from the spec."""

    base_url: str | None = Field(default=None, description="without /v1")
    api_key_env: str | None = "ANTHROPIC_API_KEY"
    find_clock_skew_s: float = Field(default=120, ge=0, description="tolerated gap between our clock and theirs")
