"""Rollout throughput of the vllm and hf engines, and weight-sync seconds -> benchmarks/results/rollout.json.

    python benchmarks/rollout.py [--small 4,4,160] [--large 64,8,32] [--repeats 3]

Both engines run in this one process on the same GSM8K prompts (chat template applied), with the same dtype,
sampling (temperature 1) and fixed lengths (``ignore_eos``), so tokens/s compare like for like. Each engine
returns token ids, text and per-token log-probs (the hf engine computes the log-probs by a teacher-forced pass,
which is part of its cost, as it is in training). A small warm-up generate per engine runs first (vLLM's first
call pays one-off kernel set-up). Batches: ``prompts,samples,tokens``. Weight sync: the full state dict of the
actor (an HF model) pushed into each engine in ``rollout.weight_sync_bucket_mb`` buckets, median of repeats,
including vLLM's repacking of the linear weights on CPU. The 1-minute load average is recorded before and
after each measurement: the machine may be shared, and every number scales with the cores actually free.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path(os.environ.get("REASONRL_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


def gsm8k_prompts(tokenizer, count: int):
    """The first ``count`` GSM8K training questions as chat-templated token ids."""
    rows = [json.loads(line) for line in (DATA / "gsm8k_train.jsonl").read_text().splitlines()[:count]]
    return [list(tokenizer.apply_chat_template(
        [{"role": "user", "content": r["question"] + "\nLet's think step by step."}],
        add_generation_prompt=True, return_dict=True)["input_ids"]) for r in rows]


def time_generate(engine, prompts, n: int, tokens: int) -> dict:
    """Generate ``n`` samples of exactly ``tokens`` tokens per prompt; tokens/s counts generated tokens."""
    from reasonrl.rollout.base import SamplingParams

    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(n=n, temperature=1.0, max_new_tokens=tokens, ignore_eos=True))
    seconds = time.perf_counter() - start
    generated = sum(len(c.token_ids) for group in out for c in group)
    assert all(len(c.logprobs) == len(c.token_ids) for group in out for c in group)
    return {"prompts": len(prompts), "samples_per_prompt": n, "max_new_tokens": tokens,
            "generated_tokens": generated, "seconds": round(seconds, 2), "tokens_per_s": round(generated / seconds, 1),
            "loadavg_1m_before": round(load_before, 2), "loadavg_1m_after": round(os.getloadavg()[0], 2)}


def time_sync(engine, model, bucket_mb: float, repeats: int) -> dict:
    """Seconds to push all parameters (tied ones once, as an actor streams them) into ``engine`` in buckets
    (median of ``repeats``)."""
    from reasonrl.rollout.weight_sync import iter_buckets

    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        buckets = 0
        for bucket in iter_buckets(model.named_parameters(), int(bucket_mb * (1 << 20))):
            engine.update_weights(bucket)
            buckets += 1
        engine.finish_weight_update()
        runs.append(time.perf_counter() - start)
    return {"bucket_mb": bucket_mb, "buckets": buckets, "seconds_median": round(statistics.median(runs), 3),
            "seconds_all": [round(r, 3) for r in runs]}


def parse_batch(text: str):
    prompts, samples, tokens = (int(x) for x in text.split(","))
    return prompts, samples, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", default="4,4,160", help="prompts,samples,tokens (the default config's batch)")
    parser.add_argument("--large", default="64,8,32", help="prompts,samples,tokens")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3, help="weight-sync repeats")
    parser.add_argument("--kv-cache-gb", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch/OpenMP threads for both engines (1: what vLLM's multi-process executor gives its "
                             "worker on a 2-core machine; on a shared machine 2 spin-waiting threads were ~10x slower)")
    parser.add_argument("--out", type=Path, default=RESULTS / "rollout.json")
    args = parser.parse_args()

    import torch

    from reasonrl.config.schema import DEFAULT_MODEL, RolloutConfig
    from reasonrl.models import load_causal_lm, load_tokenizer, resolve_model_path
    from reasonrl.rollout.hf_engine import HFRolloutEngine
    from reasonrl.rollout.vllm_engine import VLLMRolloutEngine

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    path = resolve_model_path(DEFAULT_MODEL)
    tokenizer = load_tokenizer(path)
    small, large = parse_batch(args.small), parse_batch(args.large)
    prompts = gsm8k_prompts(tokenizer, max(small[0], large[0]))
    cfg = RolloutConfig(engine="vllm", kv_cache_gb=args.kv_cache_gb, enforce_eager=True, seed=0)
    max_len = max(len(p) for p in prompts) + max(small[2], large[2]) + 8

    start = time.perf_counter()
    vllm_engine = VLLMRolloutEngine(path, cfg, dtype, "cpu", max_model_len=max_len)
    vllm_startup = time.perf_counter() - start
    hf_engine = HFRolloutEngine.from_pretrained(path, tokenizer, dtype, "cpu")
    actor = load_causal_lm(path, dtype).eval()
    engines = {"vllm": vllm_engine, "hf": hf_engine}
    for engine in engines.values():  # warm-up, not timed
        time_generate(engine, prompts[:2], 2, 8)

    result = {
        "model": DEFAULT_MODEL, "dtype": args.dtype, "device": "cpu",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "torch_threads": torch.get_num_threads()},
        "complete": False,
        "vllm": {"in_process": True, "enforce_eager": True, "kv_cache_gb": args.kv_cache_gb,
                 "startup_s": round(vllm_startup, 1)},
        "mean_prompt_tokens": round(sum(len(p) for p in prompts) / len(prompts), 1),
        "generate": {}, "weight_sync": {},
    }
    for label, (n_prompts, samples, tokens) in (("small", small), ("large", large)):
        result["generate"][label] = {}
        for name, engine in engines.items():
            result["generate"][label][name] = run = time_generate(engine, prompts[:n_prompts], samples, tokens)
            print(label, name, run, flush=True)
            save(result, args.out)
        g = result["generate"][label]
        g["vllm_over_hf"] = round(g["vllm"]["tokens_per_s"] / g["hf"]["tokens_per_s"], 2)
    result["weight_sync"]["vllm"] = time_sync(vllm_engine, actor, cfg.weight_sync_bucket_mb, args.repeats)
    result["weight_sync"]["vllm_1mb_buckets"] = time_sync(vllm_engine, actor, 1, args.repeats)
    result["weight_sync"]["hf"] = time_sync(hf_engine, actor, cfg.weight_sync_bucket_mb, args.repeats)
    print(json.dumps(result["weight_sync"]), flush=True)
    vllm_engine.shutdown()
    result["complete"] = True
    save(result, args.out)
    print(f"wrote {args.out}")


def save(result: dict, out: Path) -> None:
    """Write what is measured so far (a run cut short still leaves its numbers)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
