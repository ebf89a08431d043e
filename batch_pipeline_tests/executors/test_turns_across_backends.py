"""The same chat rows through every backend's request builder: the same request IDs (the manifest's, whichever
backend the job names), and in every request the system prompt, the few-shot examples, then the row's turns, in
order, in the provider's own shape (OpenAI and online messages, Anthropic system + messages, Bedrock's Messages
body, Gemini and Vertex contents with ``user``/``model`` roles). The examples are byte-identical in every request."""

import dataclasses
import json

import pyarrow as pa
import pytest

from batch_pipeline.core.ledger.executor import ItemShape, RequestPlan, ShardWork
from batch_pipeline.core.manifest.shards import Manifest, build_manifest
from batch_pipeline.core.spec.job import JobSpec
from batch_pipeline.core.store import Store
from batch_pipeline.executors.anthropic.format import batch_requests
from batch_pipeline.executors.bedrock.format import request_lines as bedrock_lines
from batch_pipeline.executors.google.format import contents, generate_content_request
from batch_pipeline.executors.google.gemini_batch import input_file as gemini_file
from batch_pipeline.executors.google.vertex_lines import decode_id
from batch_pipeline.executors.google.vertex_lines import request_lines as vertex_lines
from batch_pipeline.executors.online.transport import BodyBuilder
from batch_pipeline.executors.openai.format import chat_messages
from batch_pipeline.executors.openai.format import request_lines as openai_lines

SYSTEM = "Label the ticket: billing, bug or other."
EXAMPLES = [
    {"role": "user", "content": "charged twice"},
    {"role": "assistant", "content": "billing"},
    {"role": "user", "content": "crash on export"},
    {"role": "assistant", "content": "bug"},
]
ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "Ünïcode  ticket"}]},
    {
        "id": "b",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": 'my "card"\nwas charged\ttwice'},
        ],
    },
    {"id": "c", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "new feature?"}]},
]
EXPECTED = {
    "a": [("user", "Ünïcode ticket")],
    "b": [("user", "hi"), ("assistant", "Hello!"), ("user", 'my "card" was charged twice')],
    "c": [("user", "new feature?")],
}


def spec_for(path, backend: str, examples=EXAMPLES) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "chat",
            "input": {"path": str(path), "messages_field": "messages", "key_field": "id"},
            "prompt": {"version": "v1", "system": SYSTEM, "examples": examples},
            "model": "claude-haiku-4-5",
            "backend": {"name": backend},
            "sampling": {"max_tokens": 16},
            "output": {"choice": ["billing", "bug", "other"]},
        }
    )


def manifest_work(tmp_path, backend: str, examples=EXAMPLES) -> tuple[ShardWork, dict[str, str]]:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    spec = spec_for(path, backend, examples)
    store = Store(tmp_path / f"home_{backend}_{len(examples)}")
    build_manifest(spec, store)
    manifest = Manifest("chat", store)
    keys = {r["source_key"]: r["request_id"] for r in manifest.rows().to_pylist()}
    items = pa.concat_tables([manifest.shard_items(s, ["request_id", "user_prompt"]) for s in manifest.shard_ids()])
    return ShardWork("chat", "s00001", 1, "chat:s00001:1", RequestPlan.from_spec(spec), items), keys


def text_of(content) -> str:
    return content if isinstance(content, str) else "".join(block["text"] for block in content)


def openai_view(work):
    out = {}
    for line in openai_lines(work).decode().splitlines():
        obj = json.loads(line)
        out[obj["custom_id"]] = [(m["role"], m["content"]) for m in obj["body"]["messages"]]
    return out


def online_view(work):
    builder = BodyBuilder(work.plan, None)
    out = {}
    for rid, prompt in zip(work.items["request_id"].to_pylist(), work.items["user_prompt"].to_pylist()):
        messages = json.loads(builder.data(prompt))["messages"]
        assert messages == builder.kwargs(prompt)["messages"] == chat_messages(work.plan, prompt)  # both transports
        out[rid] = [(m["role"], m["content"]) for m in messages]
    return out


def anthropic_view(work):
    requests, size = batch_requests(work)
    assert size >= len(json.dumps({"requests": requests}))
    return {
        r["custom_id"]: [("system", text_of(r["params"]["system"]))]
        + [(m["role"], text_of(m["content"])) for m in r["params"]["messages"]]
        for r in requests
    }


def bedrock_view(work):
    claude = dataclasses.replace(
        work, plan=dataclasses.replace(work.plan, model="anthropic.claude-3-5-haiku-20241022-v1:0")
    )
    out = {}
    for line in bedrock_lines(claude).decode().splitlines():
        obj = json.loads(line)
        body = obj["modelInput"]
        out[obj["recordId"]] = [("system", body["system"])] + [(m["role"], m["content"]) for m in body["messages"]]
    return out


GEMINI_ROLE = {"user": "user", "model": "assistant"}


def gemini_request(request) -> list[tuple[str, str]]:
    turns = [(c["role"], c["parts"][0]["text"]) for c in request["contents"]]
    assert {role for role, _ in turns} <= {"user", "model"}  # Gemini's roles: the model's turns are "model"
    return [("system", request["systemInstruction"]["parts"][0]["text"])] + [(GEMINI_ROLE[r], t) for r, t in turns]


def gemini_view(work):
    out = {}
    for line in gemini_file(work).decode().splitlines():
        obj = json.loads(line)
        out[obj["key"]] = gemini_request(obj["request"])
    for prompt in work.items["user_prompt"].to_pylist():
        assert generate_content_request(work.plan, prompt)["contents"] == contents(work.plan, prompt)
    return out


def vertex_view(work):
    out = {}
    for line in vertex_lines(work).decode().splitlines():
        request = json.loads(line)["request"]
        out[decode_id(next(iter(request["labels"].values())))] = gemini_request(request)
    return out


VIEWS = {
    "openai_batch": openai_view,
    "online": online_view,
    "anthropic_batch": anthropic_view,
    "bedrock_batch": bedrock_view,
    "gemini_batch": gemini_view,
    "vertex_batch": vertex_view,
}


def test_the_same_rows_give_the_same_ids_whichever_backend_the_job_names(tmp_path):
    seen = {backend: manifest_work(tmp_path, backend)[1] for backend in VIEWS}
    first = seen["openai_batch"]
    assert set(first) == {"a", "b", "c"} and len(set(first.values())) == 3
    assert all(keys == first for keys in seen.values())


@pytest.mark.parametrize("backend", list(VIEWS))
def test_every_request_builder_sends_system_examples_then_the_turns_in_order(backend, tmp_path):
    work, keys = manifest_work(tmp_path, backend)
    assert work.plan.shape is ItemShape.TURNS
    view = VIEWS[backend](work)
    head = [("system", SYSTEM), *[(t["role"], t["content"]) for t in EXAMPLES]]
    assert view == {keys[k]: [*head, *turns] for k, turns in EXPECTED.items()}


def test_the_examples_are_byte_identical_in_every_request_line(tmp_path):
    work, _ = manifest_work(tmp_path, "openai_batch")
    for lines in (
        openai_lines(work),
        bedrock_lines(
            dataclasses.replace(
                work, plan=dataclasses.replace(work.plan, model="anthropic.claude-3-5-haiku-20241022-v1:0")
            )
        ),
        gemini_file(work),
        vertex_lines(work),
    ):
        text = lines.decode().splitlines()
        starts = [line.index("charged twice") - 40 for line in text]  # the examples, from the first one's opening
        spans = {line[at : line.index('"bug"', at) + 5] for line, at in zip(text, starts)}
        assert len(text) == 3 and len(spans) == 1 and "crash on export" in spans.pop()


RID = "ab" * 32


def test_a_text_job_with_examples_sends_them_before_its_one_user_message(tmp_path):
    plan = RequestPlan(
        "gpt-4o-mini",
        SYSTEM,
        spec_for(tmp_path, "openai_batch").sampling,
        spec_for(tmp_path, "openai_batch").output,
        examples=(("user", "q"), ("assistant", "bug")),
    )
    work = ShardWork("t", "s", 1, "k", plan, pa.table({"request_id": [RID], "user_prompt": ['say "hi"\n']}))
    expected = [("system", SYSTEM), ("user", "q"), ("assistant", "bug"), ("user", 'say "hi"\n')]
    for backend in ("openai_batch", "online", "anthropic_batch", "bedrock_batch", "gemini_batch", "vertex_batch"):
        view = VIEWS[backend](work)
        assert view == {RID: expected}, backend
