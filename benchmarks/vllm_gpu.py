"""The GPU variant of ``vllm_executor.py``: a random-weight model with Llama-3.1-8B dimensions, built locally.

Nothing is downloaded: ``build_tiny_llama(..., weights=False, **LLAMA_3_1_8B)`` writes the config (hidden 4096,
32 layers, 32 heads / 8 KV heads of 128, MLP 14336, vocab 128256) and a locally trained tokenizer padded to
the vocab, and vLLM fills the weights itself (``load_format="dummy"``), so the run costs what an 8B model
costs without 16 GB of files. Outputs have a fixed length (``ignore_eos``, free text), so every variant does
exactly the same work: ``--prompts`` requests sharing ~90% of their prompt tokens, ``--output-tokens`` each.

Variants and figures as in ``vllm_executor.py`` (plain ``LLM.generate`` on texts, on token IDs, and our
executor; prefix cache reset before each; medians). Estimated at about 5 minutes on one 80 GB GPU with the
defaults (engine start with CUDA graphs ~1-2 min, then ~20-40 s per run); needs vLLM with CUDA (the GPU image
of ``k8s/Dockerfile.gpu`` has it). Not run in CI. Writes ``benchmarks/out/vllm_gpu.json``.

    python benchmarks/vllm_gpu.py [--prompts 2000] [--output-tokens 128] [--rounds 1] [--tp 1]
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from vllm_executor import compare, report, system_prompt, tickets  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rules", type=int, default=13, help="length of the shared system prompt")
    parser.add_argument("--sentences", type=int, default=5, help="length of each prompt's own part")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (faster start, slower decode)")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this is the GPU benchmark (the CPU one is benchmarks/vllm_executor.py)")
    from batch_pipeline.models.tiny_llama import LLAMA_3_1_8B, build_tiny_llama

    model = build_tiny_llama(Path(tempfile.mkdtemp()) / "llama-3.1-8b-dims", weights=False, **LLAMA_3_1_8B)
    settings = {
        "model": str(model),
        "dtype": "bfloat16",
        "load_format": "dummy",
        "max_model_len": 4096,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_num_seqs": args.max_num_seqs,
        "tensor_parallel_size": args.tp,
        "enforce_eager": args.eager,
        "flush_every": 256,
    }
    result = compare(
        settings,
        system_prompt(args.rules),
        tickets(args.prompts, args.sentences),
        {"text": {}},
        args.output_tokens,
        args.rounds,
        ignore_eos=True,
    )
    result.update(
        gpu=torch.cuda.get_device_name(0),
        gpus=args.tp,
        output_tokens=args.output_tokens,
        generated_tokens_per_s={
            v: round(result[v]["generated_tokens"] / result[v]["wall_s"], 1) for v in ("plain", "plain_ids", "executor")
        },
    )
    report(result, f"vLLM executor vs plain LLM.generate ({result['gpu']}, Llama-3.1-8B dimensions, random weights)")
    print(f"  generated tokens/s: {result['generated_tokens_per_s']}")
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "vllm_gpu.json").write_text(json.dumps(result, indent=1))
    os._exit(0)  # skip vLLM's slow interpreter-exit teardown of the engine


if __name__ == "__main__":
    main()
