"""The job spec: one YAML file per job, every key validated, unknown keys rejected.

Errors name the file, the line, the field path and what was expected, because a data engineer
editing YAML at 2 a.m. should not have to guess which of forty keys is wrong.
"""

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from batch_pipeline.core.spec.backends import (  # noqa: F401
    BackendChoice,
    BackendSpec,
    CostCompareSpec,
    FallbackSpec,
    RouteCandidate,
    RouteSpec,
    SelfHostedCost,
    Strict,
    TailRescueSpec,
)
from batch_pipeline.core.spec.combinations import (
    embedding_problems,
    is_embedding_output,
    messages_problems,
    raise_at,
    sampling_problems,
)
from batch_pipeline.core.spec.contract_floor import answer_floor
from batch_pipeline.core.spec.sections import (
    JOB_NAME_PATTERN,
    CanarySpec,
    InputSpec,
    OutputSpec,
    PromptSpec,
    QualitySpec,
    RetrySpec,
    SamplingSpec,
    ShardLimits,
)

AUTO_BACKEND = "auto"  # backend: auto routes each shard (route:, core/route/)
# Dagster's own rules for owners (an email or team:<name>) and tags (keys with one optional namespace/, <= 63
# characters of [A-Za-z0-9_.-] per part), checked here so a bad one is named at its line in the spec
Owner = Annotated[str, Field(pattern=r"^(team:.+|[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,7})$")]
TagKey = Annotated[str, Field(pattern=r"^([A-Za-z0-9_.-]{1,63}/)?[A-Za-z0-9_.-]{1,63}$")]
TagValue = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{0,63}$")]


class JobSpec(Strict):
    name: str = Field(pattern=JOB_NAME_PATTERN)
    description: str = ""
    input: InputSpec
    prompt: PromptSpec
    model: str = Field(min_length=1)
    backend: BackendSpec
    sampling: SamplingSpec | None = Field(
        default=None, description=("required, except for an embeddings job, which takes none (nothing is generated)")
    )
    output: OutputSpec
    shards: ShardLimits = Field(default_factory=ShardLimits)
    retries: RetrySpec = Field(default_factory=RetrySpec)
    budget_usd: float | None = Field(default=None, ge=0)
    deadline: datetime | None = None
    tail: TailRescueSpec | None = None
    quality: QualitySpec | None = None
    cost_compare: CostCompareSpec | None = Field(
        default=None, description="backends to quote side by side and self-hosted GPU figures (core/money/compare.py)"
    )
    canary_first: bool = Field(
        default=True,
        description="run a canary sample of the first shard alone, gate on it, "
        "then re-quote (calibrated) before anything else is sent",
    )
    canary: CanarySpec = Field(default_factory=CanarySpec)
    fallback: FallbackSpec | None = Field(
        default=None,
        description="a second model for items the primary could "
        "not answer (budget spent, or a non-retryable model error)",
    )
    route: RouteSpec | None = Field(
        default=None, description="with backend: auto, the candidates the router picks from per shard (core/route/)"
    )
    # labels for the Dagster UI: on every asset and job of this spec; never part of the quote's fingerprint
    owners: list[Owner] = Field(default_factory=list, exclude=True, description="emails or team:<name>")
    tags: dict[TagKey, TagValue] = Field(default_factory=dict, exclude=True, description="Dagster tags")
    source_path: str | None = Field(default=None, exclude=True, description="set by the loader")

    @model_validator(mode="before")
    @classmethod
    def _sampling_for_the_output(cls, data: Any) -> Any:
        """``sampling`` is required for every output but an embedding, which refuses each key of it (and why)."""
        if not isinstance(data, dict):
            return data
        if is_embedding_output(data.get("output")):
            raise_at(cls.__name__, sampling_problems(data.get("sampling")))
            return {**data, "sampling": None}
        if data.get("sampling") is None:  # reported as sampling.max_tokens missing, beside any other problem
            return {**data, "sampling": {}}
        return data

    @field_validator("prompt")
    @classmethod
    def _template_uses_text_field(cls, prompt: PromptSpec, info: ValidationInfo) -> PromptSpec:
        source = info.data.get("input")
        if source is not None and source.messages_field is not None:
            if prompt.template:
                raise ValueError(
                    "prompt.template is not used with input.messages_field (the row's turns are the input); remove it"
                )
            return prompt
        if source is not None and source.text_field not in prompt.fields:
            raise ValueError(
                f"prompt.template must use the input text field {{{source.text_field}}}; "
                f"it uses {prompt.fields or 'no fields'}"
            )
        return prompt

    @model_validator(mode="after")
    def _supported_combinations(self) -> "JobSpec":
        """What chat-turns and embeddings jobs cannot combine with, each at its field (core/spec/combinations.py)."""
        raise_at(type(self).__name__, messages_problems(self) + embedding_problems(self))
        return self

    @model_validator(mode="after")
    def _max_tokens_fits_the_answer(self) -> "JobSpec":
        """``sampling.max_tokens`` below the shortest valid answer truncates every request, and each is paid for.

        Checked for every backend that sends this job's requests with its sampling (the job's, the tail's, the
        golden evals'), each with the answer form it returns (``contract_floor.CHOICE_FORMS``). The error is
        raised at ``sampling.max_tokens`` so that ``_format_errors`` names that line.
        """
        if self.sampling is None:  # an embeddings job: nothing is generated
            return self
        backends = [self.backend.name]
        if self.tail is not None:
            backends.append(self.tail.backend.name)
        if self.quality is not None:
            backends.append(self.quality.eval_backend.name)
        floors = {name: answer_floor(self.output, name) for name in backends}
        name = max(floors, key=lambda n: floors[n][1])
        answer, tokens = floors[name]
        have = self.sampling.max_tokens
        if have >= tokens:
            return self
        message = (
            f"sampling.max_tokens {have} cannot fit the shortest valid answer of the output contract "
            f"on {name} (`{answer}`, about {tokens} tokens); raise it to at least {tokens}"
        )
        # a ValueError would land on the whole spec; a ValidationError raised here keeps its own loc
        # (pydantic-core passes it through), so the error names sampling.max_tokens and its line
        raise ValidationError.from_exception_data(
            type(self).__name__,
            [
                {
                    "type": "value_error",
                    "loc": ("sampling", "max_tokens"),
                    "input": have,
                    "ctx": {"error": ValueError(message)},
                }
            ],
        )

    @model_validator(mode="after")
    def _route_needs_auto(self) -> "JobSpec":
        """``route:`` is read only with ``backend: auto``, and ``auto`` has nothing to pick from without it; a
        fallback that is the primary itself would answer nothing new."""
        if (self.backend.name == AUTO_BACKEND) != (self.route is not None):
            raise ValueError("backend: auto and route: go together (route: lists the candidates auto picks from)")
        fb = self.fallback
        if fb is not None and fb.model == self.model and (fb.backend or self.backend) == self.backend:
            raise ValueError("fallback: give another model or another backend than the job's own")
        if fb is not None and fb.backend is None and self.backend.name == AUTO_BACKEND:
            raise ValueError("fallback.backend is needed with backend: auto (the fallback is not routed)")
        return self

    @property
    def max_output_tokens(self) -> int:
        """The output tokens one request may bill: ``sampling.max_tokens``; none for an embedding (input only)."""
        return 0 if self.sampling is None else self.sampling.max_tokens

    def sending_backends(self) -> dict[str, BackendSpec]:
        """Every backend that may hold a batch of this job, by name: the job's own (unless ``auto``), the router's
        candidates, the tail's and the fallback's. A stored batch handle names its backend; this says how to
        reach it again (polls and re-attaches after a crash)."""
        found: list[BackendSpec] = []
        if self.backend.name != AUTO_BACKEND:
            found.append(self.backend)
        if self.route is not None:
            found += [c.backend for c in (*self.route.candidates, self.route.online)]
        if self.tail is not None:
            found.append(self.tail.backend)
        if self.fallback is not None and self.fallback.backend is not None:
            found.append(self.fallback.backend)
        out: dict[str, BackendSpec] = {}
        for backend in found:
            out.setdefault(backend.name, backend)
        return out

    def answering_models(self) -> list[str]:
        """Every model a row of the validated table may be answered by: the job's, the router's candidates' and
        the fallback's."""
        models = [self.model]
        if self.route is not None:
            models += [c.model or self.model for c in (*self.route.candidates, self.route.online)]
        if self.fallback is not None:
            models.append(self.fallback.model)
        return list(dict.fromkeys(models))

    def settings_fingerprint(self) -> str:
        """Everything besides the row that changes what the model is asked; part of every request ID."""
        payload = {
            "system": self.prompt.system,
            "template": self.prompt.template,
            "output": self.output.model_dump(mode="json", exclude_none=True),
        }
        if self.sampling is not None:  # an embeddings job has none
            payload["sampling"] = self.sampling.model_dump(mode="json")
        if self.prompt.examples:  # only when given, so jobs without examples keep their IDs
            payload["examples"] = [t.model_dump(mode="json") for t in self.prompt.examples]
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def input_base_dir(self) -> Path:
        """Relative input paths resolve against the spec's project root (the parent of data/jobs/)."""
        if self.source_path is None:
            return Path.cwd()
        spec_dir = Path(self.source_path).resolve().parent
        if spec_dir.name == "jobs" and spec_dir.parent.name == "data":
            return spec_dir.parent.parent
        return spec_dir
