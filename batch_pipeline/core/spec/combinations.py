"""What a job spec may combine, checked when it loads: every refusal names its field and says why.

An embeddings job (``output.embedding``) sends one text per row, the rendered template, to an embedding model and
stores the vector. So it takes no ``sampling`` (nothing is generated), no system prompt or few-shot examples
(neither is sent), no chat turns (``input.messages_field``: no single text to embed), no golden set (a vector has no
label), only the backends that serve embeddings (``EMBEDDING_BACKENDS``), and no second model (a fallback or a
routed candidate on another model would put vectors of two spaces in one table, where their similarities mean
nothing; the same model on another backend is fine).

A chat-turns job (``input.messages_field``) reads its turns from input files: an upstream job's validated table
(``input.from_job``) holds answers, not turns, and golden records are rendered through ``prompt.template``, which
a turns job does not have.

Pure rules over the spec; ``JobSpec``'s validators raise them (``raise_at``) so each lands on its own field's line.
"""

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    from batch_pipeline.core.spec.job import JobSpec

Problem = tuple[tuple[str | int, ...], str, Any]  # (the field's path in the spec, what is wrong and why, its value)

# the backends whose executors send embeddings requests (openai/embeddings.py, google/embed_format.py,
# online/embeddings.py, vllm/embed.py)
EMBEDDING_BACKENDS = ("openai_batch", "gemini_batch", "online", "vllm")
WHY_NO_EMBEDDINGS = {
    "azure_openai_batch": "embeddings through Azure's batch API are not offered yet (its batch deployments take "
    "chat completions here)",
    "anthropic_batch": "Anthropic has no embeddings API",
    "vertex_batch": "Vertex batch prediction of embedding models is not implemented (google-genai's "
    "batches.create_embeddings is Gemini Developer API only)",
    "bedrock_batch": "the Bedrock executor sends Claude messages only",
}
SAMPLING_WHY = {
    "temperature": "nothing is sampled: the vector is a fixed function of the input text",
    "top_p": "nothing is sampled: there is no token distribution to cut",
    "max_tokens": "an embeddings request generates no tokens (it is billed as input only), so there is nothing to cap",
    "seed": "nothing is random: the same text always gets the same vector",
}


def is_embedding_output(output: Any) -> bool:
    """``output`` as given to the spec (a mapping, or an ``OutputSpec``) asks for an embedding."""
    if isinstance(output, dict):
        return output.get("embedding") is not None
    return getattr(output, "embedding", None) is not None


def sampling_problems(sampling: Any) -> list[Problem]:
    """Each key of an embeddings job's ``sampling``, refused with the reason it means nothing there."""
    if sampling is None:
        return []
    given = (
        sampling
        if isinstance(sampling, dict)
        else {k: getattr(sampling, k) for k in getattr(sampling, "model_fields_set", ())}
    )
    return [
        (
            ("sampling", key),
            f"an embeddings job (output.embedding) uses no sampling: {key}: "
            f"{SAMPLING_WHY.get(key, 'not a sampling setting, and an embeddings job takes none')}"
            "; remove `sampling` from the spec",
            value,
        )
        for key, value in sorted(given.items())
    ]


def _backends(spec: "JobSpec") -> list[tuple[tuple[str | int, ...], str]]:
    """Every backend that may send the job's requests, with where the spec names it."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    if spec.backend.name != "auto":
        found.append((("backend", "name"), spec.backend.name))
    if spec.tail is not None:
        found.append((("tail", "backend", "name"), spec.tail.backend.name))
    if spec.fallback is not None and spec.fallback.backend is not None:
        found.append((("fallback", "backend", "name"), spec.fallback.backend.name))
    if spec.route is not None:
        found += [
            (("route", "candidates", i, "backend", "name"), c.backend.name) for i, c in enumerate(spec.route.candidates)
        ]
        found.append((("route", "online", "backend", "name"), spec.route.online.backend.name))
    return found


def embedding_problems(spec: "JobSpec") -> list[Problem]:
    """What an embeddings job cannot use (``sampling`` is refused before the spec is built: ``sampling_problems``)."""
    if spec.output.embedding is None:
        return []
    out: list[Problem] = []
    if spec.input.messages_field is not None:
        out.append(
            (
                ("input", "messages_field"),
                "an embeddings job embeds one text per row (input.text_field "
                "through prompt.template); chat turns have no single text to embed",
                spec.input.messages_field,
            )
        )
    if spec.prompt.system:
        out.append(
            (
                ("prompt", "system"),
                "an embeddings job sends no system prompt: the vector is of the rendered "
                "template alone (put text that should be embedded in the template)",
                spec.prompt.system,
            )
        )
    if spec.prompt.examples:
        out.append(
            (
                ("prompt", "examples"),
                "an embeddings job sends no few-shot examples: the vector is of the rendered template alone",
                len(spec.prompt.examples),
            )
        )
    if spec.quality is not None:
        out.append(
            (
                ("quality",),
                "golden records check answers against labels, and a vector has none (the gate "
                "checks every vector's dimensions, finite values and norm)",
                spec.quality.golden,
            )
        )
    if spec.fallback is not None and spec.fallback.model != spec.model:
        out.append(
            (
                ("fallback", "model"),
                f"another embedding model puts its vectors in another space than the "
                f"job's ({spec.model}): mixed in one table, their similarities mean nothing; give the job's "
                "model on another backend, or no fallback",
                spec.fallback.model,
            )
        )
    if spec.route is not None:
        n = len(spec.route.candidates)
        for i, c in enumerate((*spec.route.candidates, spec.route.online)):
            if c.model is not None and c.model != spec.model:
                loc: tuple[str | int, ...] = (
                    ("route", "candidates", i, "model") if i < n else ("route", "online", "model")
                )
                out.append(
                    (
                        loc,
                        f"another embedding model puts its vectors in another space than the job's "
                        f"({spec.model}): route every candidate to the job's model",
                        c.model,
                    )
                )
    for loc, name in _backends(spec):
        if name not in EMBEDDING_BACKENDS:
            why = WHY_NO_EMBEDDINGS.get(name, "it is not a backend that sends embeddings requests")
            out.append(
                (
                    loc,
                    f"{name} does not run embeddings jobs (output.embedding): {why}; the backends that do: "
                    f"{', '.join(EMBEDDING_BACKENDS)}",
                    name,
                )
            )
    return out


def messages_problems(spec: "JobSpec") -> list[Problem]:
    """What a chat-turns job (``input.messages_field``) cannot combine with (``from_job``: ``InputSpec``)."""
    if spec.input.messages_field is None or spec.quality is None:
        return []
    return [
        (
            ("quality",),
            "golden records are not supported with input.messages_field yet: a golden row is "
            "rendered through prompt.template, and a chat-turns job has none",
            spec.quality.golden,
        )
    ]


def raise_at(title: str, problems: list[Problem]) -> None:
    """Raise every problem as one ``ValidationError``, each at its own field (so the loader names its line)."""
    if not problems:
        return
    raise ValidationError.from_exception_data(
        title,
        [
            {"type": "value_error", "loc": loc, "input": value, "ctx": {"error": ValueError(message)}}
            for loc, message, value in problems
        ],
    )
