"""Every line of a batch is processed by the time it ends, whatever its in-progress span: (start + span) - start
falls a hair short of span in floating point at epoch-sized clock values, and once that left the last line of
every batch unanswered (in_progress_s 0.3 lost one line per batch)."""

import json
import time

import openai
import pytest


@pytest.mark.parametrize("span", [0.2, 0.3, 0.7, 1.1])
def test_a_batch_that_completes_has_answered_every_line(admin, sandbox_proc, span):
    _, url = sandbox_proc
    admin.set_scenario("normal", in_progress_s=span)
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-sandbox")
    lines = "".join(
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "gpt-4o-mini",
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": f"hello {i}"}],
                },
            }
        )
        + "\n"
        for i in range(3)
    )
    file = client.files.create(file=("in.jsonl", lines.encode()), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed"
    assert batch.request_counts.completed == batch.request_counts.total == 3
