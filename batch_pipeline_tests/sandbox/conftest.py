"""Fixtures for the sandbox tests: one sandbox process per module, reset before every test."""

from __future__ import annotations

from collections.abc import Iterator
from subprocess import Popen

import anthropic
import openai
import pytest

from batch_pipeline.sandbox import SandboxAdmin


@pytest.fixture
def sandbox_url(sandbox_proc: tuple[Popen[str], str]) -> str:
    """Base url of the worker's sandbox process."""
    return sandbox_proc[1]


@pytest.fixture
def admin(sandbox_url: str) -> Iterator[SandboxAdmin]:
    """Admin client; the sandbox is reset before the test (files, batches, ledger, log, scenario, clock)."""
    client = SandboxAdmin(sandbox_url)
    client.reset()
    yield client


@pytest.fixture
def client(sandbox_url: str, admin: SandboxAdmin) -> Iterator[openai.OpenAI]:
    """The real OpenAI SDK pointed at the sandbox."""
    sdk = openai.OpenAI(base_url=sandbox_url + "/v1", api_key="sk-sandbox", max_retries=2, timeout=20)
    yield sdk
    sdk.close()


@pytest.fixture
def aclient(sandbox_url: str, admin: SandboxAdmin) -> Iterator[anthropic.Anthropic]:
    """The real Anthropic SDK pointed at the sandbox (base_url without /v1)."""
    sdk = anthropic.Anthropic(base_url=sandbox_url, api_key="sk-sandbox", max_retries=2, timeout=20)
    yield sdk
    sdk.close()
