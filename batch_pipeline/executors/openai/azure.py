"""Azure OpenAI Batch (``azure_openai_batch``): the OpenAI batch executor through ``openai.AzureOpenAI``.

What differs from OpenAI is only the shape of the service: the resource endpoint with an ``/openai`` path
prefix and an ``api-version`` query on every call, an ``api-key`` header (or a Microsoft Entra bearer token),
a *deployment* name where OpenAI takes a model name (in each request line's ``body.model``), and the relative
URL ``/chat/completions`` for the batch endpoint and the lines. Upload, create-once with ``find()`` before a
retry, polling, the status table and result parsing are the OpenAI executor's own.
"""

import os

import openai

from batch_pipeline.core.error_table import Family
from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.ledger.executor import ShardWork
from batch_pipeline.executors.endpoint import resolve_endpoint
from batch_pipeline.executors.openai.batch import OpenAIBatchExecutor
from batch_pipeline.executors.openai.format import request_lines
from batch_pipeline.executors.openai.settings import AzureOpenAIBatchSettings
from batch_pipeline.executors.tls import shared_tls_context

AZURE_CHAT_URL = "/chat/completions"


class AzureOpenAIBatchExecutor(OpenAIBatchExecutor):
    name = "azure_openai_batch"
    provider = "Azure OpenAI"
    family = Family.AZURE  # its rows of the error table (DeploymentNotFound, content_filter)
    chat_url = AZURE_CHAT_URL
    embeddings_url = None  # embeddings jobs through Azure's batch API are not offered yet
    settings_model = AzureOpenAIBatchSettings
    settings: AzureOpenAIBatchSettings

    def _make_client(self, settings: AzureOpenAIBatchSettings) -> tuple[openai.OpenAI, str | None]:  # type: ignore[override]
        token = os.environ.get(settings.ad_token_env) if settings.ad_token_env else None
        endpoint, api_key = resolve_endpoint(
            self.name,
            sandbox=settings.sandbox,
            base_url=settings.base_url or os.environ.get(settings.endpoint_env),
            api_key_env=settings.api_key_env,
            key_required=False,
        )
        if not endpoint:
            raise ConfigError(
                f"backend {self.name} needs the resource endpoint in backend.settings.base_url or "
                f"${settings.endpoint_env}"
            )
        common = {
            "azure_endpoint": endpoint,
            "api_version": settings.api_version,
            "max_retries": settings.max_retries,
            "timeout": settings.timeout_s,
            "http_client": openai.DefaultHttpxClient(verify=shared_tls_context()),
        }
        if token:
            return openai.AzureOpenAI(azure_ad_token=token, **common), token
        if not api_key:
            raise ConfigError(
                f"backend {self.name} needs a key in ${settings.api_key_env} or an Entra ID token "
                f"in ${settings.ad_token_env}"
            )
        return openai.AzureOpenAI(api_key=api_key, **common), api_key

    def deployment(self, model: str) -> str:
        return self.settings.deployments.get(model, model)

    def _request_lines(self, work: ShardWork) -> bytes:
        return request_lines(work, url=AZURE_CHAT_URL, model=self.deployment(work.plan.model))
