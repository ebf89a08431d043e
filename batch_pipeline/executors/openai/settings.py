"""``backend.settings`` of ``openai_batch`` and ``azure_openai_batch``, apart from their executors: the registry reads
them when a code location loads (each job's Dagster pool), and the ``openai`` SDK costs ~0.5 s to import."""

from pydantic import Field

from batch_pipeline.executors.settings import BatchProviderSettings

GA_API_VERSION = "2024-10-21"  # Azure's data-plane GA version that carries Files and Batches


class OpenAIBatchSettings(BatchProviderSettings):
    """``backend.settings`` of ``openai_batch``. The key is read from the environment, never from the spec."""

    api_key_env: str | None = "OPENAI_API_KEY"
    completion_window: str = "24h"


class AzureOpenAIBatchSettings(OpenAIBatchSettings):
    """``backend.settings`` of ``azure_openai_batch``; ``base_url`` is the resource endpoint
    (``https://RESOURCE.openai.azure.com``), else ``$AZURE_OPENAI_ENDPOINT``. Credentials come from the
    environment only: an Entra ID token in ``ad_token_env`` wins over the key in ``api_key_env``."""

    api_key_env: str | None = "AZURE_OPENAI_API_KEY"
    ad_token_env: str | None = Field(
        default="AZURE_OPENAI_AD_TOKEN", description="environment variable holding a Microsoft Entra ID bearer token"
    )
    endpoint_env: str = "AZURE_OPENAI_ENDPOINT"
    api_version: str = GA_API_VERSION
    deployments: dict[str, str] = Field(
        default_factory=dict, description="model -> Global-Batch deployment name (default: the model name)"
    )
