"""How cheap could a columnar OpenAI sandbox be? The floor of the steps it would share with today's per-line one.

Both sides run in this process on the same ``sandbox_bench.batch_file`` (``--long``: e2e_bench's 300-1,500 character
prompts), alternating rounds, CPU seconds per request:

- per line (today's sandbox, its own functions): the create's ``parse_input`` with the ``RequestKeeper`` a create
  uses (each line parsed and checked, its billed prompt tokens counted exactly, 8,192 requests' texts at a time
  since the count went column-wise; before, by cached chunks one text at a time), ``json.loads``
  again when the line is run (the spool's re-read), its three IDs (``sandbox.ids.stable_hex``) and its output line
  (``spooled_results.output_line_json``) around a fixed answer body;
- columnar floor: Arrow's JSON reader over the whole file, the user messages selected column-wise, counted by chunk
  (Arrow's split, ``dictionary_encode``, one cache lookup per distinct chunk, summed with numpy), the same three IDs,
  and the output lines by one ``pl.concat_str``.

The columnar count is an estimate (a text's first chunk and a space before other whitespace are not handled), so its
total is checked to be within 2% of the exact one. This measures a floor, not a sandbox: the columnar side checks
nothing at create, and the label pick, the markers, the scenarios and the HTTP layer are on neither side. The first
round warms the chunk cache for both, as a long-running sandbox's is.

    python benchmarks/sandbox_floor.py [--requests 50000] [--rounds 3]
"""

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.json as pajson  # noqa: E402

from batch_pipeline.bpe import counter  # noqa: E402
from batch_pipeline.sandbox.ids import stable_hex  # noqa: E402
from batch_pipeline.sandbox.openai.create_tokens import RequestKeeper  # noqa: E402
from batch_pipeline.sandbox.openai.spooled_results import output_line_json  # noqa: E402
from batch_pipeline.sandbox.openai.validation import CHAT_URL, parse_input  # noqa: E402
from batch_pipeline.sandbox.scenarios import Scenario  # noqa: E402
from benchmarks.sandbox_bench import batch_file  # noqa: E402

BATCH_ID = "batch_floor"
BODY_JSON = (
    '{"id":"chatcmpl-x","object":"chat.completion","choices":[{"message":{"content":"{\\"label\\":\\"other\\"}"}}]}'
)
Steps = dict[str, float]


class _Answer:
    """What ``output_line_json`` reads off an answer."""

    __slots__ = ("custom_id", "request_id", "status_code")

    def __init__(self, custom_id: str, request_id: str):
        self.custom_id, self.request_id, self.status_code = custom_id, request_id, 200


def timed(steps: Steps, name: str, fn: Callable[[], object]) -> object:
    started = time.process_time()
    out = fn()
    steps[name] = steps.get(name, 0.0) + time.process_time() - started
    return out


def per_line(data: bytes, steps: Steps) -> int:
    """Today's steps, one line at a time; the prompt tokens of the whole file."""
    lines = data.splitlines()

    def create():  # what a create keeps of each line: its custom_id, line and tokens
        keep = RequestKeeper(CHAT_URL, Scenario())
        parsed = parse_input(data, CHAT_URL, keep)
        keep.finish()
        return parsed

    created = timed(steps, "create: parse, check, count", create)
    assert not created.errors, created.errors[:3]
    tokens = [r["prompt_tokens"] for r in created.requests]
    # when run, the sandbox reads each line back and drops it once answered: only its custom_id is kept here
    custom_ids = timed(steps, "parse when run", lambda: [json.loads(line)["custom_id"] for line in lines])

    def ids() -> list[tuple[str, str, str]]:
        return [
            (stable_hex(BATCH_ID, c, "request"), stable_hex(BATCH_ID, c, "completion"), stable_hex(BATCH_ID, c, "line"))
            for c in custom_ids
        ]

    triples = timed(steps, "IDs", ids)

    def encode() -> str:
        return "".join(
            output_line_json("batch_req_" + t[2], _Answer(c, "req_" + t[0]), BODY_JSON) + "\n"
            for c, t in zip(custom_ids, triples)
        )

    timed(steps, "output lines", encode)
    return sum(tokens)


def columnar(data: bytes, steps: Steps) -> int:
    """The same steps over the whole file at once; the (estimated) user-message tokens of the whole file."""
    table = timed(steps, "create: parse", lambda: pajson.read_json(pa.BufferReader(data)))

    def select() -> pa.Array:
        messages = pc.list_flatten(table.column("body").combine_chunks().field("messages"))
        return pc.filter(messages.field("content"), pc.equal(messages.field("role"), "user"))

    user = timed(steps, "parse when run", select)  # what the per-line side's second parse is for
    chunk_counter = counter("o200k_base")
    encode_one = chunk_counter._encode
    cache = chunk_counter._counts

    def count() -> np.ndarray:
        parts = pc.split_pattern(user, " ")
        encoded = pc.list_flatten(parts).dictionary_encode()
        known = []
        for chunk in encoded.dictionary.to_pylist():
            n = cache.get(chunk)
            if n is None:
                n = cache[chunk] = len(encode_one(" " + chunk))
            known.append(n)
        per_chunk = np.asarray(known, dtype=np.int64)[encoded.indices.to_numpy()]
        return np.add.reduceat(per_chunk, parts.offsets.to_numpy()[:-1])

    tokens = timed(steps, "create: count", count)
    custom_ids = table.column("custom_id").to_pylist()

    def ids() -> pl.DataFrame:
        base = hashlib.sha256(BATCH_ID.encode() + b"\x1f")
        columns: dict[str, list[str]] = {"request": [], "completion": [], "line": []}
        for custom_id in custom_ids:
            for kind, out in columns.items():
                digest = base.copy()
                digest.update(f"{custom_id}\x1f{kind}".encode())
                out.append(digest.hexdigest()[:24])
        return pl.DataFrame({"custom_id": custom_ids, **columns})

    frame = timed(steps, "IDs", ids)

    def encode() -> pl.Series:
        head = pl.lit('{"id":"batch_req_')
        parts = [head, pl.col("line"), pl.lit('","custom_id":'), pl.col("custom_id").map_elements(json.dumps)]
        parts += [pl.lit(',"response":{"status_code":200,"request_id":"req_'), pl.col("request")]
        parts += [pl.lit('","body":' + BODY_JSON + '},"error":null}\n')]
        return frame.select(pl.concat_str(parts)).to_series()

    timed(steps, "output lines", encode)
    return int(tokens.sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    data = batch_file(0, args.requests, long=True)
    exact_user = sum(
        counter("o200k_base")(json.loads(line)["body"]["messages"][1]["content"]) for line in data.splitlines()
    )
    per_request = {"per line": [], "columnar": []}
    for round_no in range(args.rounds + 1):  # round 0 warms the chunk cache
        for name, fn in (("per line", per_line), ("columnar", columnar)):
            steps: Steps = {}
            tokens = fn(data, steps)
            if name == "columnar":
                assert abs(tokens - exact_user) <= 0.02 * exact_user, (tokens, exact_user)
            if round_no:
                total = sum(steps.values()) / args.requests * 1e6
                per_request[name].append(total)
                shown = "  ".join(f"{k} {v / args.requests * 1e6:5.1f}" for k, v in steps.items())
                print(f"round {round_no} {name:9s} {total:6.1f} us/request  ({shown})", flush=True)
    line, col = (sorted(v)[len(v) // 2] for v in per_request.values())
    print(f"median: per line {line:.1f} us/request, columnar floor {col:.1f} ({col / line:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
