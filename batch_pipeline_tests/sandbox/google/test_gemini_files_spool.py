"""The Gemini Files API keeps no bytes in memory: an upload's chunks are appended to a part in the spool as they
arrive and the finalized file is a blob there (``gemini-<id>``)."""

from __future__ import annotations

import io

from google import genai

from batch_pipeline.sandbox import SandboxServer
from batch_pipeline.sandbox.google.gemini_files import BLOB_PREFIX


def test_uploads_and_files_are_blobs_in_the_spool() -> None:
    data = b"".join(b'{"key": "k%d", "request": {"contents": [{"parts": [{"text": "x"}]}]}}\n' % i for i in range(9))
    with SandboxServer(port=0) as server:
        files, spool = server.app.state.gemini_files, server.app.state.spool
        client = genai.Client(api_key="k", http_options={"base_url": server.url})
        stored = client.files.upload(file=io.BytesIO(data), config={"mime_type": "jsonl"})
        kept = files.get(str(stored.name).removeprefix("files/"))
        assert not any(isinstance(value, bytes | bytearray) for value in vars(kept).values())
        assert kept.path == spool.path(BLOB_PREFIX + kept.id) and kept.path.read_bytes() == data
        assert files.uploads == {} and not list(spool.root.glob("*upload*"))  # the session's part became the blob
        session = files.open_upload("s1", kept)
        session.append(b"abc")
        session.append(b"de")
        assert session.path.parent == spool.root and session.path.read_bytes() == b"abcde" and session.received == 5
