"""Our vLLM executor against plain ``LLM.generate``: same engine, same prompts, one run (CPU, tiny model).

Workload: a classification set whose prompts share ~90% of their tokens (a long system prompt, then a short
ticket), rendered through the model's chat template; output = one label from a fixed set (structured outputs,
``choice``). Variants, on one engine (``load_engine`` of the executor's settings), prefix cache reset before each:

- ``plain``: ``llm.generate(texts, SamplingParams(structured_outputs=choice))`` on the pre-rendered prompt texts
  (rendering not timed: the strictest baseline; vLLM tokenizes).
- ``plain_ids``: the same, given the prompts already tokenized (``{"prompt_token_ids": ...}``, not timed): the
  engine loop alone, the floor for any client.
- ``executor``: ``VllmOfflineExecutor.run(work)`` on the raw rows (renders, tokenizes, orders by length with a
  pre-flight pass, steps the engine, builds Arrow tables every ``flush_every`` results). The tables are
  consumed, not written (the store is the runner's).

Rounds alternate plain, plain_ids, executor, executor, plain_ids, plain, ...; figures are medians. tokens/s =
(prompt + generated tokens) / wall; ratio = executor tokens/s / plain tokens/s (target >= 0.95), and the same
against plain_ids. The cached-token share is the executor's (target > 0.8 on this set). Writes
``benchmarks/out/vllm_executor.json``. Needs the vLLM venv:

    . .venv-vllm/bin/activate && python benchmarks/vllm_executor.py [--prompts 2000] [--rounds 3] [--in-process]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

LABELS = ["billing", "bug", "feature_request", "account", "other"]
TOPICS = ["invoice", "refund", "password", "crash", "export", "seats", "login", "charge", "upload", "dashboard"]


def system_prompt(rules: int) -> str:
    head = (
        "You label customer support tickets. Answer with exactly one label from the allowed set: billing "
        "(charges, invoices, refunds), bug (something broken), feature_request (asks for something new), "
        "account (login, password, profile, access), other (anything else).\n"
    )
    return head + "".join(
        f"Rule {i}: read the whole ticket, the subject and the body, before you answer; when a "
        f"ticket is about an invoice or a charge or a refund the answer is billing; when the app "
        f"is broken or slow or fails the answer is bug.\n"
        for i in range(1, rules + 1)
    )


def tickets(n: int, sentences: int) -> list[str]:
    out = []
    for i in range(n):
        t = TOPICS[i % len(TOPICS)]
        body = " ".join(
            f"The {TOPICS[(i + k) % len(TOPICS)]} page fails since {(i * 7 + k) % 28} days for user "
            f"{(i * 7919 + k) % 100000}."
            for k in range(sentences)
        )
        out.append(f"Subject: ticket {i} about the {t}\nTicket:\n{body}")
    return out


def run_plain(llm, texts: list, params) -> dict:
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    outs = llm.generate(texts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    gen = sum(len(o.outputs[0].token_ids) for o in outs)
    cached = sum(o.num_cached_tokens or 0 for o in outs)
    return {
        "wall_s": wall,
        "prompt_tokens": prompt,
        "generated_tokens": gen,
        "cached_tokens": cached,
        "items": len(outs),
    }


def run_executor(llm, executor, work) -> dict:
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    rows = sum(t.num_rows for t in executor.run(work))
    wall = time.perf_counter() - t0
    m = executor.last_metrics
    return {
        "wall_s": wall,
        "prompt_tokens": m["prompt_tokens"],
        "generated_tokens": m["generated_tokens"],
        "cached_tokens": m["cached_tokens"],
        "items": rows,
        "engine_s": m["engine_s"],
        "prep_s": m["prep_s"],
    }


def compare(
    settings: dict,
    system: str,
    users: list[str],
    output: dict,
    max_tokens: int,
    rounds: int,
    model_name: str = "bench",
    ignore_eos: bool = False,
) -> dict:
    """Run both variants on one engine; return per-variant medians, the ratio and the cached share."""
    import pyarrow as pa

    from batch_pipeline.core.ledger.executor import RequestPlan, ShardWork
    from batch_pipeline.core.spec.job import OutputSpec, SamplingSpec
    from batch_pipeline.executors.vllm.engine import VllmSettings, load_engine
    from batch_pipeline.executors.vllm.offline import VllmOfflineExecutor
    from batch_pipeline.executors.vllm.prompts import PromptRenderer, sampling_params

    s = VllmSettings.model_validate({**settings, "ignore_eos": ignore_eos})
    executor = VllmOfflineExecutor(s)
    started = time.perf_counter()
    llm = load_engine(s)
    engine_start = time.perf_counter() - started
    plan = RequestPlan(model_name, system, SamplingSpec(temperature=0, max_tokens=max_tokens), OutputSpec(**output))
    params = sampling_params(plan, s)  # the same SamplingParams for both variants
    renderer = PromptRenderer(llm.get_tokenizer(), system)
    texts = [renderer.head_tail[0] + u + renderer.head_tail[1] for u in users] if renderer.head_tail else None
    assert texts is not None, "the chat template could not be spliced"
    items = pa.table({"request_id": [f"r{i:06d}" for i in range(len(users))], "user_prompt": users})
    work = ShardWork("bench", "s00001", 1, "bench:s00001:1", plan, items)
    # warm-up on a few prompts: grammar compiled, kernels touched
    warm = ShardWork("bench", "warm", 1, "bench:warm:1", plan, items.slice(0, 16))
    list(executor.run(warm))
    llm.generate(texts[:16], params, use_tqdm=False)
    ids = [{"prompt_token_ids": p} for p in renderer.token_ids(users)]
    runs: dict[str, list[dict]] = {"plain": [], "plain_ids": [], "executor": []}
    order = ["plain", "plain_ids", "executor", "executor", "plain_ids", "plain"] * rounds
    for variant in order[: 3 * rounds]:
        if variant == "executor":
            r = run_executor(llm, executor, work)
        else:
            r = run_plain(llm, texts if variant == "plain" else ids, params)
        r["tokens_per_s"] = (r["prompt_tokens"] + r["generated_tokens"]) / r["wall_s"]
        runs[variant].append(r)
        print(
            f"  {variant:9s} {r['wall_s']:7.2f} s  {r['tokens_per_s']:9.0f} tok/s  cached "
            f"{r['cached_tokens'] / r['prompt_tokens']:.3f}",
            flush=True,
        )
    med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in runs.items()}
    shared = len(llm.get_tokenizer()(renderer.head_tail[0], add_special_tokens=False)["input_ids"])
    return {
        "engine_start_s": round(engine_start, 1),
        "prompts": len(users),
        "rounds": rounds,
        "shared_prefix_tokens": shared,
        "shared_prefix_share": round(shared * len(users) / med["executor"]["prompt_tokens"], 3),
        "plain": med["plain"],
        "plain_ids": med["plain_ids"],
        "executor": med["executor"],
        "ratio": round(med["executor"]["tokens_per_s"] / med["plain"]["tokens_per_s"], 3),
        "ratio_vs_plain_ids": round(med["executor"]["tokens_per_s"] / med["plain_ids"]["tokens_per_s"], 3),
        "cached_share": round(med["executor"]["cached_tokens"] / med["executor"]["prompt_tokens"], 3),
        "runs": runs,
    }


def report(result: dict, title: str) -> None:
    p, i, e = result["plain"], result["plain_ids"], result["executor"]
    print(
        f"\n{title}: {result['prompts']} prompts, shared prefix {result['shared_prefix_tokens']} tokens "
        f"({100 * result['shared_prefix_share']:.0f}% of prompt tokens), engine start {result['engine_start_s']} s"
    )
    print(f"  plain LLM.generate  {p['tokens_per_s']:9.0f} tok/s  ({p['wall_s']:.2f} s)")
    print(f"  plain, token IDs    {i['tokens_per_s']:9.0f} tok/s  ({i['wall_s']:.2f} s)")
    print(
        f"  our executor        {e['tokens_per_s']:9.0f} tok/s  ({e['wall_s']:.2f} s; engine {e['engine_s']:.2f} s, "
        f"prep {e['prep_s']:.2f} s)"
    )
    print(
        f"  ratio {result['ratio']:.3f} (target >= 0.95; vs token IDs {result['ratio_vs_plain_ids']:.3f})   "
        f"cached-token share {result['cached_share']:.3f} (target > 0.8)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (plain, executor), alternating order")
    parser.add_argument("--rules", type=int, default=13, help="length of the shared system prompt")
    parser.add_argument("--sentences", type=int, default=5, help="length of each ticket")
    parser.add_argument("--in-process", action="store_true", help="engine core and worker in this process")
    parser.add_argument("--model", help="a model directory (default: the tiny Llama, built here)")
    args = parser.parse_args()
    from batch_pipeline.executors.vllm.engine import prepare_in_process_threads
    from batch_pipeline.models.tiny_llama import build_tiny_llama

    if args.in_process:
        prepare_in_process_threads()
    model = args.model or str(build_tiny_llama(Path(tempfile.mkdtemp()) / "tiny-llama"))
    settings = {
        "model": model,
        "dtype": "float32",
        "enforce_eager": True,
        "max_model_len": 2048,
        "kv_cache_memory_bytes": 512 * 2**20,
        "multiprocessing": not args.in_process,
        "flush_every": 256,
    }
    result = compare(
        settings, system_prompt(args.rules), tickets(args.prompts, args.sentences), {"choice": LABELS}, 16, args.rounds
    )
    result.update(cores=os.cpu_count(), load=round(os.getloadavg()[0], 2), in_process=args.in_process)
    report(result, "vLLM executor vs plain LLM.generate (CPU)")
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "vllm_executor.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
