"""The same OpenAI batch file through vLLM's ``run_batch`` and through ``batch-pipeline run`` (CPU, tiny model).

One batch input file: N chat requests (``POST /v1/chat/completions``) sharing a long system prompt, each with a
short ticket (``vllm_executor.py``'s workload), temperature 0, one label of five (``structured_outputs:
{choice: [...]}``, max_tokens 16: what our executor tightens a choice to), on the tiny random-weight Llama
(``python -m batch_pipeline.models.tiny_llama DIR``, built once in a temp dir). Two variants, each a child
process started from here, on the same engine settings (float32, ``enforce_eager``, ``max_model_len`` 2048,
a 512 MiB KV cache, prefix caching, xgrammar with compact whitespace, seed 0):

- ``run_batch``: ``python -m vllm.entrypoints.openai.run_batch -i in.jsonl -o out.jsonl --model DIR ...``
  (vLLM's AsyncLLM: the API process and its engine core process).
- ``ours``: ``batch-pipeline run spec.yaml`` on a job spec that reads the same file (``input.format:
  openai_batch``, ``key_field: custom_id``, ``text_field: user``, ``template: "{user}"``), ``backend: vllm``
  with the settings above, no canary (run_batch has none), a fresh storage root and ``DAGSTER_HOME`` per run:
  manifest, quote, the shard on the engine, checks, publish (validated table, DuckDB file, report).
  ``--multiprocessing true|false`` sets the backend's ``multiprocessing`` (engine core and worker in processes
  of their own, as run_batch has them, or in the step's process); default: unset, the backend's default.

Memory: every 0.2 s the sampler reads ``/proc/PID/status`` (VmRSS, VmHWM) and ``/proc/PID/smaps_rollup`` (Pss)
of the child and all its descendants (run_batch's engine core and worker are processes of their own, as ours are
with ``multiprocessing: true``). Reported per run: the peak of the summed RSS (shared pages counted in each process that
maps them), the peak of the summed PSS (shared pages split between the processes: the tree's real footprint)
and each process's own peak (VmHWM, exact, whatever the sampling). Wall: from the start of the child to its exit.
Checks: every request answered (run_batch: a 200 with a label for every custom_id; ours: a validated row with a
label for every custom_id). Variants alternate ``run_batch, ours`` per round; medians and ratios ours/run_batch.
Writes ``benchmarks/out/vllm_run_batch.json``. Needs the vLLM venv:

    .venv-vllm/bin/python benchmarks/vllm_run_batch.py [--prompts 2000] [--rounds 2] [--multiprocessing true|false]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [p for p in (str(HERE), str(REPO)) if p not in sys.path]

from vllm_executor import LABELS, system_prompt, tickets  # noqa: E402 - the same workload

MODEL = "tiny-llama"
MIB = 2**20
ENGINE = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 2048,
    "kv_cache_memory_bytes": 512 * MIB,
    "seed": 0,
    "structured_outputs_backend": "xgrammar",
    "disable_any_whitespace": True,
}


def write_batch_file(path: Path, system: str, users: list[str], max_tokens: int) -> list[str]:
    ids = [f"t{i:06d}" for i in range(len(users))]
    with path.open("w") as f:
        for cid, user in zip(ids, users, strict=True):
            body = {
                "model": MODEL,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                "temperature": 0,
                "max_tokens": max_tokens,
                "structured_outputs": {"choice": LABELS},
            }
            f.write(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}))
            f.write("\n")
    return ids


def run_batch_argv(model_dir: Path, inp: Path, out: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(inp), "-o", str(out)),
        *("--model", str(model_dir), "--served-model-name", MODEL, "--dtype", ENGINE["dtype"], "--enforce-eager"),
        *(
            "--max-model-len",
            str(ENGINE["max_model_len"]),
            "--kv-cache-memory-bytes",
            str(ENGINE["kv_cache_memory_bytes"]),
        ),
        *("--seed", str(ENGINE["seed"]), "--enable-prefix-caching", "--distributed-executor-backend", "uni"),
        "--structured-outputs-config",
        json.dumps({"backend": ENGINE["structured_outputs_backend"], "disable_any_whitespace": True}),
    ]


def write_job(root: Path, model_dir: Path, inp: Path, system: str, max_tokens: int, mp: str | None) -> Path:
    settings = {"model": str(model_dir), **ENGINE, **({"multiprocessing": mp == "true"} if mp else {})}
    spec = {
        "name": "run_batch_bench",
        "input": {
            "path": str(inp),
            "format": "openai_batch",
            "key_field": "custom_id",
            "text_field": "user",
            "max_input_tokens": 4000,
        },
        "prompt": {"version": "v1", "system": system, "template": "{user}"},
        "model": MODEL,
        "backend": {"name": "vllm", "settings": settings},
        "sampling": {"temperature": 0, "max_tokens": max_tokens},
        "output": {"choice": LABELS},
        "shards": {"max_requests": 5000},
        "canary_first": False,
        "budget_usd": 1,
    }
    (root / "prices.yaml").write_text(
        yaml.safe_dump(
            {"prices": {"vllm": {MODEL: {"input_per_mtok": 0.0, "output_per_mtok": 0.0, "checked": "2026-12-05"}}}}
        )
    )
    path = root / "run_batch_bench.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _status(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def _pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


class TreeSampler(threading.Thread):
    """Peak summed RSS and PSS of a process and its descendants, and each process's own peak (VmHWM)."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.stop = threading.Event()
        self.peak_rss = self.peak_pss = 0  # KiB
        self.procs: dict[int, dict] = {}  # pid -> {name, hwm (KiB)}

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)

    def sample(self) -> None:
        todo, rss, pss = [self.pid], 0, 0
        while todo:
            pid = todo.pop()
            try:
                st = _status(pid)
                if st.get("State", "").startswith("Z"):
                    continue
                p_rss = int(st.get("VmRSS", "0 kB").split()[0])
                hwm = int(st.get("VmHWM", "0 kB").split()[0])
                p_pss = _pss_kib(pid)
            except (OSError, ValueError):
                continue
            rss, pss = rss + p_rss, pss + p_pss
            rec = self.procs.setdefault(pid, {"name": st.get("Name", "?"), "hwm": 0})
            rec["hwm"] = max(rec["hwm"], hwm)
            rec["name"] = st.get("Name", rec["name"])
            todo.extend(_children(pid))
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)


def run_child(argv: list[str], env: dict, cwd: Path, log: Path) -> dict:
    load = os.getloadavg()[0]
    with log.open("wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        code = proc.wait()
        wall = time.perf_counter() - t0
        sampler.stop.set()
        sampler.join()
    if code != 0:
        raise SystemExit(f"{argv[:4]} exited {code}; log {log}:\n" + log.read_text()[-4000:])
    procs = sorted(sampler.procs.values(), key=lambda r: -r["hwm"])
    return {
        "wall_s": round(wall, 2),
        "tree_rss_mib": round(sampler.peak_rss / 1024),
        "tree_pss_mib": round(sampler.peak_pss / 1024),
        "sum_hwm_mib": round(sum(r["hwm"] for r in procs) / 1024),
        "processes": [{"name": r["name"], "hwm_mib": round(r["hwm"] / 1024)} for r in procs if r["hwm"] > 10 * 1024],
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
    }


def check_run_batch(out: Path, ids: list[str]) -> None:
    got = {}
    for line in out.read_text().splitlines():
        obj = json.loads(line)
        resp = obj.get("response") or {}
        assert resp.get("status_code") == 200, obj
        got[obj["custom_id"]] = resp["body"]["choices"][0]["message"]["content"]
    assert sorted(got) == ids, f"run_batch answered {len(got)} of {len(ids)}"
    assert set(got.values()) <= set(LABELS), set(got.values()) - set(LABELS)


def check_ours(home: Path, ids: list[str]) -> None:
    import pyarrow.parquet as pq

    from batch_pipeline.core.spec.paths import JobPaths

    table = pq.read_table(home / JobPaths("run_batch_bench").validated, columns=["source_key", "output"])
    keys = table.column("source_key").to_pylist()
    assert sorted(keys) == ids, f"ours answered {len(set(keys))} of {len(ids)}"
    assert set(table.column("output").to_pylist()) <= set(LABELS)


def one_run(variant: str, work: Path, model_dir: Path, inp: Path, spec: Path, ids: list[str], n: int) -> dict:
    run_dir = work / f"{variant}-{n}"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "BATCH_PIPELINE_HOME")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO))
    if variant == "run_batch":
        out = run_dir / "out.jsonl"
        r = run_child(run_batch_argv(model_dir, inp, out), env, run_dir, run_dir / "log.txt")
        check_run_batch(out, ids)
    else:
        env.update(DAGSTER_HOME=str(run_dir / "dagster"), BATCH_PIPELINE_PRICES=str(work / "prices.yaml"))
        cli = str(Path(sys.executable).parent / "batch-pipeline")
        argv = [cli, "run", str(spec), "--home", str(run_dir / "home")]
        r = run_child(argv, env, run_dir, run_dir / "log.txt")
        check_ours(run_dir / "home", ids)
    procs = ", ".join(f"{p['name']} {p['hwm_mib']}" for p in r["processes"])
    print(
        f"  {variant:9s} {r['wall_s']:7.2f} s  tree RSS {r['tree_rss_mib']:5d} MiB  PSS {r['tree_pss_mib']:5d} MiB  "
        f"(per process peak: {procs})  load {r['load'][0]}-{r['load'][1]}",
        flush=True,
    )
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rules", type=int, default=13, help="length of the shared system prompt")
    parser.add_argument("--sentences", type=int, default=5, help="length of each ticket")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--multiprocessing", choices=["true", "false"], help="ours: the backend setting (default unset)"
    )
    parser.add_argument("--only", choices=["run_batch", "ours"], help="run one variant only (profiling)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, outputs)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vllm_run_batch_"))
    model_dir = work / "tiny-llama"
    subprocess.run([sys.executable, "-m", "batch_pipeline.models.tiny_llama", str(model_dir)], check=True, cwd=REPO)
    system = system_prompt(args.rules)
    inp = work / "in.jsonl"
    ids = write_batch_file(inp, system, tickets(args.prompts, args.sentences), args.max_tokens)
    spec = write_job(work, model_dir, inp, system, args.max_tokens, args.multiprocessing)
    variants = [args.only] if args.only else ["run_batch", "ours"]
    print(f"{args.prompts} requests, {len(variants)} variant(s) x {args.rounds} rounds; work dir {work}", flush=True)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for n in range(args.rounds):
        for v in variants:
            runs[v].append(one_run(v, work, model_dir, inp, spec, ids, n))
    keys = ("wall_s", "tree_rss_mib", "tree_pss_mib", "sum_hwm_mib")
    med = {v: {k: statistics.median(r[k] for r in rs) for k in keys} for v, rs in runs.items()}
    result = {
        "prompts": args.prompts,
        "rounds": args.rounds,
        "multiprocessing": args.multiprocessing,
        "cores": os.cpu_count(),
        "median": med,
        "runs": runs,
    }
    print(
        f"\nmedians of {args.rounds} round(s), {args.prompts} requests{f' (ours: multiprocessing {args.multiprocessing})' if args.multiprocessing else ''}:"
    )
    for v, m in med.items():
        print(
            f"  {v:9s} wall {m['wall_s']:7.2f} s  tree RSS {m['tree_rss_mib']:6.0f} MiB  PSS {m['tree_pss_mib']:6.0f} MiB"
        )
    if len(med) == 2:
        ratio = {k: round(med["ours"][k] / med["run_batch"][k], 3) for k in keys}
        result["ratio_ours_over_run_batch"] = ratio
        print(
            f"  ours / run_batch: wall {ratio['wall_s']:.3f}x (target <= 0.8), memory: PSS {ratio['tree_pss_mib']:.3f}x, "
            f"RSS {ratio['tree_rss_mib']:.3f}x (target <= 1.5)"
        )
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "vllm_run_batch.json").write_text(json.dumps(result, indent=1))
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
