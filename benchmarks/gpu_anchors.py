"""Anchors for ``gpu_grpo_step.py``: standalone vLLM ``generate`` on the same model, prompts and lengths -> JSON.

    python benchmarks/gpu_anchors.py [--shape qwen2.5-1.5b] [--out results/gpu_anchors.json]

A fresh ``vllm.LLM`` with vLLM's own defaults (the whole GPU to itself: ``gpu_memory_utilization`` 0.9, CUDA
graphs, no sleep mode), the same random-weight Qwen2.5-1.5B-shaped model and tokenizer as the step benchmark
(``write_random_model``; reused if that run left it), 64 prompts of 256 random tokens x 8 samples x exactly
1024 tokens: one warm-up and ``--repeats`` timed calls, each without log-probs (plain vLLM) and with the sampled
token's log-prob (what the hybrid engine asks for). If ``--step-json`` names a finished ``gpu_grpo_step`` result,
the ratio of the hybrid engine's rollout tokens/s to these is written too.

TRL's GRPOTrainer anchor is not run here (see benchmarks/README.md: not carried yet).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from reasonrl.bench.records import RESULTS, exit_with_status, recorded, write  # noqa: E402
from reasonrl.bench.shapes import SHAPES, write_random_model  # noqa: E402


def timed_generate(llm, prompts, params) -> dict:
    import torch

    from vllm.inputs import TokensPrompt

    requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(requests, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/reasonrl-bench-model"))
    p.add_argument("--step-json", type=Path, default=None, help="a gpu_grpo_step result to compare with")
    p.add_argument("--out", type=Path, default=RESULTS / "gpu_anchors.json")
    args = p.parse_args()

    import torch

    result = {"benchmark": "gpu_anchors", "status": "running", "args": {k: str(v) for k, v in vars(args).items()},
              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
              "trl_grpo_trainer": "not run: TRL and HF datasets are not carried to the GPU machine yet"}
    wall = time.perf_counter()
    with recorded(args.out, result, wall):
        import vllm
        from vllm import LLM, SamplingParams

        result["machine"]["vllm"] = vllm.__version__
        model_dir = write_random_model(args.shape, args.model_dir / args.shape)
        vocab = SHAPES[args.shape]["vocab_size"]
        rng = random.Random(0)  # the same prompts as gpu_grpo_step.py (same seed, same draws)
        prompts = [[rng.randrange(1, vocab - 1) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
        max_len = args.prompt_len + args.response_len
        t0 = time.perf_counter()
        kwargs = dict(model=str(model_dir), dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32,
                      seed=0, enforce_eager=args.enforce_eager, max_model_len=max_len)
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
        else:
            kwargs["kv_cache_memory_bytes"] = 1 << 30
        llm = LLM(**kwargs)
        result["engine_start_s"] = time.perf_counter() - t0
        plain = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.response_len, ignore_eos=True)
        with_lp = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.response_len, ignore_eos=True,
                                 logprobs=0)
        result["warmup"] = timed_generate(llm, prompts, plain)
        runs = {"plain": [], "with_logprobs": []}
        for _ in range(args.repeats):
            runs["plain"].append(timed_generate(llm, prompts, plain))
            runs["with_logprobs"].append(timed_generate(llm, prompts, with_lp))
            result["runs"] = runs
            write(args.out, result)
        result["mean_tokens_per_s"] = {k: sum(r["tokens_per_s"] for r in v) / len(v) for k, v in runs.items()}
        print(f"standalone vLLM: {result['mean_tokens_per_s']}", flush=True)
        if args.step_json and args.step_json.exists():
            step = json.loads(args.step_json.read_text())
            hybrid = step.get("mean", {}).get("rollout_tokens_per_s")
            if hybrid:
                result["hybrid_rollout_tokens_per_s"] = hybrid
                result["hybrid_vs_standalone"] = {k: hybrid / v for k, v in result["mean_tokens_per_s"].items()}
    print(f"wrote {args.out} ({result['status']})", flush=True)
    exit_with_status(result)


if __name__ == "__main__":
    main()
