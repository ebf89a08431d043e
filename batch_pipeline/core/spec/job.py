"""The job spec: one YAML file per job, every key validated, unknown keys rejected.

Errors name the file, the line, the field path and what was expected, because a data engineer
editing YAML at 2 a.m. should not have to guess which of forty keys is wrong.
"""

import hashlib
import json
import string
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

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

JOB_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,47}$"
AUTO_BACKEND = "auto"  # backend: auto routes each shard (route:, core/route/)
# Dagster's own rules for owners (an email or team:<name>) and tags (keys with one optional namespace/, <= 63
# characters of [A-Za-z0-9_.-] per part), checked here so a bad one is named at its line in the spec
Owner = Annotated[str, Field(pattern=r"^(team:.+|[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,7})$")]
TagKey = Annotated[str, Field(pattern=r"^([A-Za-z0-9_.-]{1,63}/)?[A-Za-z0-9_.-]{1,63}$")]
TagValue = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{0,63}$")]


class ConfidenceFilter(Strict):
    """``input.confidence_below``: the upstream rows whose JSON output field ``field`` is below ``threshold``."""

    field: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    threshold: float


class InputSpec(Strict):
    """Where the rows are and which field holds the text to classify."""

    path: str | None = Field(
        default=None, description="file, directory or glob; local or s3://bucket/prefix/*.jsonl (or from_job)"
    )
    format: Literal["auto", "jsonl", "csv", "parquet", "openai_batch"] = Field(
        default="auto", description="openai_batch: an OpenAI/vLLM batch input file (custom_id, method, url, body)"
    )
    text_field: str | None = Field(default=None, description="the field the template must use (or messages_field)")
    messages_field: str | None = Field(
        default=None,
        description=(
            "a field holding the row's chat turns, a list of {role, content} (user/assistant, text); no template"
        ),
    )
    key_field: str | None = Field(default=None, description="source-key column kept for every row")
    max_input_tokens: int = Field(default=8000, gt=0, description="longer rendered prompts go to rejects")
    # multi-pass jobs (core/manifest/upstream.py): the rows are another job's validated table
    from_job: str | None = Field(
        default=None,
        pattern=JOB_NAME_PATTERN,
        description=(
            "read the validated table of this job (a pass before this one) instead of files; its fields and output "
            "are the template's fields"
        ),
    )
    where: str | None = Field(
        default=None,
        min_length=1,
        description=("with from_job: a SQL condition over the upstream's validated columns, e.g. output = 'other'"),
    )
    confidence_below: ConfidenceFilter | None = Field(
        default=None, description=("with from_job: only rows whose JSON output field is below a threshold (or missing)")
    )
    assumed_share: float = Field(
        default=0.30,
        gt=0,
        le=1,
        description=("with from_job: the share of upstream rows the quote assumes pass the filter, until measured"),
    )

    @model_validator(mode="after")
    def _one_source(self) -> "InputSpec":
        if (self.path is None) == (self.from_job is None):
            raise ValueError("give exactly one of input.path (files) and input.from_job (another job's table)")
        if self.from_job is None and (self.where is not None or self.confidence_below is not None):
            raise ValueError("input.where and input.confidence_below filter an input.from_job table")
        if self.from_job is not None and self.format != "auto":
            raise ValueError("input.format does not apply to input.from_job (the upstream's validated Parquet)")
        return self

    @model_validator(mode="after")
    def _one_input_shape(self) -> "InputSpec":
        if (self.text_field is None) == (self.messages_field is None):
            raise ValueError(
                "give exactly one of input.text_field (a templated prompt) and input.messages_field "
                "(chat turns per row)"
            )
        if self.messages_field is not None and self.format == "csv":
            raise ValueError(
                "input.messages_field needs JSONL, Parquet or openai_batch input (a CSV cell holds no list)"
            )
        if self.messages_field is not None and self.from_job is not None:
            raise ValueError(
                "input.messages_field cannot read input.from_job: an upstream job's validated table holds "
                "its answers, not chat turns; use input.text_field with a template over the upstream's "
                "fields ({output}, ...)"
            )
        return self


class Turn(Strict):
    """One few-shot turn of ``prompt.examples``: sent as given, right after the system prompt, in every request."""

    role: Literal["user", "assistant"]
    content: str = Field(min_length=1)


class PromptSpec(Strict):
    """Stable prefix first (system), per-row fields last (template)."""

    version: str = Field(min_length=1)
    system: str = ""
    template: str = Field(default="", description="user message with {field} placeholders (none with messages_field)")
    examples: list[Turn] = Field(
        default_factory=list,
        description=("few-shot turns after the system prompt: user/assistant alternating, first user, last assistant"),
    )

    @property
    def fields(self) -> list[str]:
        names = []
        for _, name, _, _ in string.Formatter().parse(self.template):
            if name is not None and name not in names:
                names.append(name)
        return names

    @property
    def prefix_text(self) -> str:
        """What every request sends before the row's part: the system prompt and the examples' contents (the
        fixed, cacheable part that token estimates count once per request)."""
        return self.system + "".join(t.content for t in self.examples)

    @field_validator("examples")
    @classmethod
    def _examples_alternate(cls, examples: list[Turn]) -> list[Turn]:
        """The row's turns start with a user turn, so the examples end with the assistant's answer."""
        for i, turn in enumerate(examples):
            want = "user" if i % 2 == 0 else "assistant"
            if turn.role != want:
                raise ValueError(f"examples[{i}] must be a {want} turn (user and assistant alternate, user first)")
        if examples and examples[-1].role != "assistant":
            raise ValueError("the last example must be an assistant turn (the row's turns begin with the user)")
        return examples

    @field_validator("template")
    @classmethod
    def _placeholders_are_plain(cls, template: str) -> str:
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise ValueError(f"template is not a valid format string: {exc}") from None
        for _, name, spec, conv in parsed:
            if name is None:
                continue
            if not name.isidentifier() or spec or conv:
                raise ValueError(f"placeholder {{{name}}} must be a plain field name like {{body}}")
        return template


class SamplingSpec(Strict):
    temperature: float = Field(default=0.0, ge=0, le=2)
    max_tokens: int = Field(gt=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None


class EmbeddingSpec(Strict):
    """An embeddings job: one vector per row, of exactly ``dimensions`` float32 values (the gate checks it)."""

    dimensions: int = Field(
        gt=0,
        le=16384,
        description="length of every vector (OpenAI text-embedding-3: asked for; a pooling model: its hidden size)",
    )


class OutputSpec(Strict):
    """Exactly one output contract: a fixed label set, a JSON schema, free text, or an embedding."""

    choice: list[str] | None = None
    json_schema: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    embedding: EmbeddingSpec | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "OutputSpec":
        given = [k for k in ("choice", "json_schema", "text", "embedding") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of choice, json_schema, text, embedding (got {given or 'none'})")
        if self.choice is not None:
            if not self.choice or len(set(self.choice)) != len(self.choice):
                raise ValueError("choice must be a non-empty list of distinct labels")
        if self.json_schema is not None and self.json_schema.get("type") != "object":
            raise ValueError("json_schema must describe an object (type: object)")
        return self

    @property
    def kind(self) -> Literal["choice", "json_schema", "text", "embedding"]:
        if self.choice is not None:
            return "choice"
        if self.embedding is not None:
            return "embedding"
        return "json_schema" if self.json_schema is not None else "text"


class ShardLimits(Strict):
    max_requests: int = Field(default=5000, gt=0)
    max_bytes: int = Field(default=100 * 2**20, gt=0)
    manifest_memory_mb: int = Field(
        default=3072,
        gt=0,
        description=(
            "memory a manifest build may use (fits a 4 GB pod): past half of it the dedup spills to hash ranges"
        ),
    )


class RetrySpec(Strict):
    """Retry budgets per error class (the seed rule: transient errors are retried with backoff; an invalid or
    truncated answer is retried once, then dead-lettered; a poison item is not retried), within ``per_item``."""

    per_item: int = Field(default=3, ge=1, description="failed attempts of any class before an item is dead-lettered")
    transient: int | None = Field(default=None, ge=1, description="transient failures allowed (default per_item)")
    invalid_output: int = Field(default=2, ge=1, description="answers that break the contract or are truncated")
    poison: int = Field(default=1, ge=1, description="requests the provider rejects as malformed or too long")
    spend_cap_share: float = Field(default=0.10, ge=0, le=1)


class CompareSpec(Strict):
    """The B side of a paired comparison on the golden set: another prompt and/or another model."""

    prompt: PromptSpec | None = None
    model: str | None = None


class JudgeSpec(Strict):
    """Judge sampling for free-text outputs: a stratified sample graded by a judge model."""

    backend: BackendSpec = Field(default_factory=lambda: BackendSpec(name="online"))
    model: str | None = Field(default=None, description="default: the job's model")
    sample_size: int = Field(default=200, gt=0)
    instructions: str = (
        "You grade an answer to a task. Reply pass (correct, complete, follows the task) "
        "or fail (wrong, incomplete, off-task)."
    )


class QualitySpec(Strict):
    """Golden records (trusted labels) and the gates and evals built on them."""

    golden: str = Field(description="JSONL with the input fields and a trusted label per row")
    label_field: str = "label"
    canary_min_accuracy: float = Field(default=0.85, ge=0, le=1)
    golden_share: float = Field(default=0.01, ge=0, le=0.5, description="golden probes mixed into every shard")
    eval_backend: BackendSpec = Field(default_factory=lambda: BackendSpec(name="online"))
    compare: CompareSpec | None = None
    target_half_width: float = Field(
        default=0.03, gt=0, lt=0.5, description="precision wanted for accuracy (95% interval half-width)"
    )
    judge: JudgeSpec | None = None


class CanarySpec(Strict):
    """A small sample of the first shard, run alone before anything else is paid for (with every golden probe)."""

    size: int = Field(default=300, gt=0, description="items in the canary, a stratified sample across lengths")
    max_failure_rate: float = Field(
        default=0.05, ge=0, le=1, description="structural failures (invalid or truncated answers) allowed"
    )


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
