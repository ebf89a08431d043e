"""The JSON schema a job's output contract asks the model for, as every backend that takes a schema sends it.

A choice is ``choice_schema`` of its labels (``{"label": ...}``), a JSON-schema contract its own schema, and free
text none. Anthropic and Bedrock send it as a forced tool's ``input_schema``, Gemini and Vertex as the
``responseSchema``; OpenAI wraps it in its ``response_format`` (``openai/format.py``).
"""

from typing import Any

from batch_pipeline.core.ledger.executor import RequestPlan
from batch_pipeline.core.spec.contract_floor import choice_schema


def output_schema(plan: RequestPlan) -> dict[str, Any] | None:
    """The JSON schema the output must follow (None for free text)."""
    if plan.output.kind == "choice":
        return choice_schema(plan.output.choice or [])
    if plan.output.kind == "json_schema":
        return plan.output.json_schema
    return None
