"""The sections of a job spec (input, prompt, sampling, output, shards, retries, quality, canary): each a strict
model whose errors name the field; ``job.JobSpec`` puts them together and checks what spans sections."""

import string
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from batch_pipeline.core.spec.backends import BackendSpec, Strict

JOB_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,47}$"


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
        default="auto",
        description=(
            "openai_batch: an OpenAI/vLLM batch input file (custom_id, method, url, body); auto reads the name, "
            "and a .gz/.zst/.bz2 file is decompressed as it is read"
        ),
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
