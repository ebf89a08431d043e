"""What a spec may combine is decided when it loads: an embeddings job takes no sampling (each key refused with
its reason) and none of the settings it cannot use; chat-turns jobs take no golden set and no upstream table. Each
refusal names the file, the line, the field and why."""

import re
from pathlib import Path

import pytest

from batch_pipeline.core.errors import ConfigError
from batch_pipeline.core.spec.combinations import EMBEDDING_BACKENDS, WHY_NO_EMBEDDINGS
from batch_pipeline.core.spec.loading import load_spec

EMBED = """\
name: vectors
input: {path: in.jsonl, text_field: body, key_field: id}
prompt: {version: e1, template: "{body}"}
model: text-embedding-3-small
backend: {name: openai_batch}
output: {embedding: {dimensions: 64}}
"""

CHAT = """\
name: chat
input: {path: in.jsonl, messages_field: messages, key_field: id}
prompt: {version: v1, system: Label it.}
model: gpt-4o-mini
backend: {name: openai_batch}
sampling: {max_tokens: 16}
output: {choice: [a, b]}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "data" / "jobs" / "job.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def refusal(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_spec(path)
    message = str(exc.value)
    assert message.startswith(str(path)), message  # the file
    return message


def problem(message: str, field: str) -> str:
    lines = [ln for ln in message.splitlines() if f"field '{field}'" in ln]
    assert len(lines) == 1, message
    return lines[0]


def line_of(line: str) -> int:
    found = re.search(r"\bline (\d+)\b", line)
    assert found, line
    return int(found.group(1))


def test_an_embeddings_job_loads_without_sampling_and_bills_no_output(tmp_path):
    spec = load_spec(write(tmp_path, EMBED))
    assert spec.sampling is None and spec.max_output_tokens == 0
    again = load_spec(write(tmp_path, EMBED + "sampling: null\n"))  # an explicit null is the same job
    assert again.settings_fingerprint() == spec.settings_fingerprint()
    # the vector's length is part of what is asked: another length, another request ID
    other = load_spec(write(tmp_path, EMBED.replace("dimensions: 64", "dimensions: 32")))
    assert other.settings_fingerprint() != spec.settings_fingerprint()


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("temperature", 0, "nothing is sampled"),
        ("max_tokens", 16, "generates no tokens"),
        ("top_p", 0.9, "no token distribution"),
        ("seed", 7, "the same text always gets the same vector"),
    ],
)
def test_each_sampling_key_of_an_embeddings_job_is_refused_with_its_reason(tmp_path, key, value, why):
    text = EMBED + f"sampling:\n  {key}: {value}\n"
    line = problem(refusal(tmp_path, text), f"sampling.{key}")
    assert line_of(line) == 8 and "embeddings job (output.embedding) uses no sampling" in line and why in line
    assert "remove `sampling`" in line


def test_every_sampling_key_given_is_named(tmp_path):
    message = refusal(tmp_path, EMBED + "sampling: {temperature: 0, max_tokens: 8, top_k: 3}\n")
    assert "3 problem(s)" in message
    for key in ("temperature", "max_tokens", "top_k"):
        assert line_of(problem(message, f"sampling.{key}")) == 7
    assert "not a sampling setting" in problem(message, "sampling.top_k")


def test_a_generating_job_still_needs_sampling(tmp_path):
    text = CHAT.replace("sampling: {max_tokens: 16}\n", "")
    assert "required key is missing" in problem(refusal(tmp_path, text), "sampling.max_tokens")


def test_chat_turns_cannot_be_embedded(tmp_path):
    text = EMBED.replace("text_field: body", "messages_field: messages").replace(', template: "{body}"', "")
    line = problem(refusal(tmp_path, text), "input.messages_field")
    assert line_of(line) == 2 and "chat turns have no single text to embed" in line


def test_a_golden_set_is_refused_with_chat_turns_and_says_why(tmp_path):
    line = problem(refusal(tmp_path, CHAT + "quality: {golden: g.jsonl}\n"), "quality")
    assert line_of(line) == 8 and "not supported with input.messages_field" in line
    assert "rendered through prompt.template" in line


def test_chat_turns_cannot_come_from_an_upstream_table(tmp_path):
    text = CHAT.replace("path: in.jsonl", "from_job: triage")
    line = problem(refusal(tmp_path, text), "input")
    assert line_of(line) == 2 and "input.messages_field cannot read input.from_job" in line
    assert "holds its answers, not chat turns" in line


@pytest.mark.parametrize(
    ("extra", "field", "why"),
    [
        ("", "prompt.system", "sends no system prompt"),
        ("", "prompt.examples", "sends no few-shot examples"),
        ("quality: {golden: g.jsonl}\n", "quality", "a vector has none"),
        ("fallback: {model: text-embedding-3-large}\n", "fallback.model", "another space"),
    ],
)
def test_what_an_embeddings_job_cannot_use_is_refused(tmp_path, extra, field, why):
    text = EMBED + extra
    if field == "prompt.system":
        text = text.replace("version: e1,", "version: e1, system: Embed it.,")
    if field == "prompt.examples":
        text = text.replace(
            "version: e1,", "version: e1, examples: [{role: user, content: x}, {role: assistant, content: y}],"
        )
    assert why in problem(refusal(tmp_path, text), field)


def test_the_same_embedding_model_on_another_backend_may_fall_back(tmp_path):
    spec = load_spec(write(tmp_path, EMBED + "fallback: {model: text-embedding-3-small, backend: {name: online}}\n"))
    assert spec.fallback is not None and spec.fallback.backend is not None


@pytest.mark.parametrize(
    ("backend", "extra", "field", "refused"),
    [
        ("vertex_batch", "", "backend.name", "vertex_batch"),
        ("anthropic_batch", "", "backend.name", "anthropic_batch"),
        ("azure_openai_batch", "", "backend.name", "azure_openai_batch"),
        ("openai_batch", "tail: {backend: {name: bedrock_batch}}\n", "tail.backend.name", "bedrock_batch"),
        (
            "openai_batch",
            "fallback: {model: text-embedding-3-small, backend: {name: vertex_batch}}\n",
            "fallback.backend.name",
            "vertex_batch",
        ),
        (
            "auto",
            "route: {candidates: [{backend: {name: openai_batch}}, {backend: {name: anthropic_batch}}]}\n",
            "route.candidates.1.backend.name",
            "anthropic_batch",
        ),
    ],
)
def test_an_embeddings_job_on_a_backend_that_does_not_embed_is_refused(tmp_path, backend, extra, field, refused):
    text = EMBED.replace("backend: {name: openai_batch}", f"backend: {{name: {backend}}}") + extra
    line = problem(refusal(tmp_path, text), field)
    assert f"{refused} does not run embeddings jobs" in line and WHY_NO_EMBEDDINGS[refused] in line
    assert "the backends that do: openai_batch, gemini_batch, online, vllm" in line


def test_an_embeddings_job_on_gemini_batch_loads(tmp_path):
    """Gemini batch embeddings (asyncBatchEmbedContent) are served, by the sandbox too: no refusal any more."""
    text = EMBED.replace("backend: {name: openai_batch}", "backend: {name: gemini_batch}").replace(
        "text-embedding-3-small", "gemini-embedding-001"
    )
    spec = load_spec(write(tmp_path, text))
    assert spec.backend.name == "gemini_batch" and spec.output.embedding is not None
    assert "gemini_batch" in EMBEDDING_BACKENDS and "gemini_batch" not in WHY_NO_EMBEDDINGS


def test_the_embedding_backends_are_the_executors_that_embed():
    """Every registered backend is either in the table or has a reason; the table's executors send embeddings."""
    from batch_pipeline.executors.openai.azure import AzureOpenAIBatchExecutor
    from batch_pipeline.executors.openai.batch import OpenAIBatchExecutor
    from batch_pipeline.executors.registry import names

    assert set(EMBEDDING_BACKENDS) | set(WHY_NO_EMBEDDINGS) == set(names())
    assert not set(EMBEDDING_BACKENDS) & set(WHY_NO_EMBEDDINGS)
    assert OpenAIBatchExecutor.embeddings_url is not None and AzureOpenAIBatchExecutor.embeddings_url is None
