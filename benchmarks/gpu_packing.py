"""Padding-free packing on the GPU: the old-log-prob pass and the actor update on long-tailed lengths, padded vs
packed, on a random-weight Qwen2.5-1.5B-shaped model -> JSON.

    python benchmarks/gpu_packing.py --out results/gpu_packing.json [--shape qwen2.5-1.5b] [--rows 64]
        [--prompt-len 256] [--median 400] [--max-len 2048] [--budget 16384] [--deadline-s 150]

Runs the real ``ActorRolloutRefWorker`` in this process (world size 1, as ``gpu_update_mfu.py``: no vLLM, no Ray) on
``--rows`` rows of random prompt tokens and responses whose lengths come from ``reasonrl.bench.lengths.response_lengths(
"longtail", ...)`` (the same draw ``gpu_grpo_step.py --length-dist longtail`` uses). Layouts, in this order:

- ``padded_rows``: fixed micro-batches of ``--micro-batch`` rows, padded to the batch's longest row (the default);
- ``padded_budget``: rows grouped by length under ``--budget`` tokens (``actor.max_tokens_per_micro_batch``),
  each micro-batch padded to its own longest row;
- ``packed_budget_sdpa``: ``actor.use_packing=true`` under the same budget, sdpa with the packed row's dense mask;
- ``packed_budget_flex``: the same with ``model.attn_implementation=flex_attention`` (a second worker: the model is
  loaded again; its first call compiles the block-mask kernel, outside the timed calls).

Per layout: seconds of the no-grad log-prob pass and of one update (forward + loss + backward over the batch, grad
clip, AdamW step; one mini-batch), after one untimed call of each; valid tokens/s; peak memory; and the largest
difference of its log-probs from the first layout's (bf16 on the GPU; every log-prob pass of a worker runs before its
updates, so all of them see the same weights). Written after every layout; ``--deadline-s`` skips
layouts that would end after it. ``--shape tiny`` runs it on a CPU (fp32) as a smoke test.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import time
from pathlib import Path
from typing import Any, Dict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from reasonrl.bench.lengths import response_lengths  # noqa: E402
from reasonrl.bench.records import exit_with_status, recorded, write  # noqa: E402
from reasonrl.bench.shapes import H200_BF16_DENSE_FLOPS, SHAPES, parameter_count, write_random_model  # noqa: E402
from reasonrl.bench.update_worker import make_worker, timed  # noqa: E402
from reasonrl.data import Batch  # noqa: E402
from reasonrl.data.collate import collate_rollout  # noqa: E402

LAYOUTS = {  # name -> (use_packing, token budget on, attention implementation)
    "padded_rows": (False, False, "sdpa"),
    "padded_budget": (False, True, "sdpa"),
    "packed_budget_sdpa": (True, True, "sdpa"),
    "packed_budget_flex": (True, True, "flex_attention"),
}


def long_tailed_batch(args, vocab: int) -> Batch:
    """Random prompt tokens and long-tailed random responses (no EOS inside), GRPO-like advantages per row."""
    rng = random.Random(0)
    lengths = response_lengths("longtail", args.rows, args.max_len, args.median, seed=0)
    prompts = [[rng.randrange(1, vocab - 1) for _ in range(args.prompt_len)] for _ in range(args.rows)]
    responses = [[rng.randrange(1, vocab - 1) for _ in range(n)] for n in lengths]
    batch = collate_rollout(prompts, responses, [[0.0] * n for n in lengths], pad_id=vocab - 1)
    advantages = torch.randn(args.rows, generator=torch.Generator().manual_seed(1))
    batch["advantages"] = advantages[:, None] * batch["response_mask"]
    batch["returns"] = batch["advantages"].clone()
    return batch


def use_layout(worker, packed: bool, budget: int) -> None:
    worker.cfg.actor.use_packing = packed
    worker.cfg.actor.max_tokens_per_micro_batch = budget


def time_log_probs(worker, batch: Batch, n_params: int) -> Dict[str, Any]:
    timed(lambda: worker.compute_log_probs(batch), 1)  # warm-up (flex: compiles)
    out = timed(lambda: worker.compute_log_probs(batch), 1)
    return _rates(out, batch, 2 * n_params)


def time_update(worker, batch: Batch, old_log_probs: torch.Tensor, n_params: int) -> Dict[str, Any]:
    train_batch = batch.union(Batch({"old_log_probs": old_log_probs}))
    timed(lambda: worker.update_actor(train_batch), 1)
    out = timed(lambda: worker.update_actor(train_batch), 1)
    out.pop("result")
    return _rates(out, batch, 6 * n_params)


def _rates(out: Dict[str, Any], batch: Batch, flops_per_token: float) -> Dict[str, Any]:
    out["valid_tokens_per_s"] = float(batch["attention_mask"].sum()) / out["mean_s"]
    out["mfu_valid_tokens"] = flops_per_token * out["valid_tokens_per_s"] / H200_BF16_DENSE_FLOPS
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=None, help="(the longest response: --max-len)")
    p.add_argument("--median", type=int, default=400)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=16, help="rows per micro-batch of padded_rows")
    p.add_argument("--budget", type=int, default=16384, help="tokens per micro-batch of the budget layouts")
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--deadline-s", type=float, default=150.0)
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/reasonrl-bench-model"))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.response_len = args.max_len  # make_worker sizes rollout.max_new_tokens from it
    args.steps = 1

    on_gpu = torch.cuda.is_available()
    wall_start = time.perf_counter()
    n_params = parameter_count(args.shape)
    result: Dict[str, Any] = {
        "benchmark": "gpu_packing", "status": "running", "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if on_gpu else None, "cpus": os.cpu_count()},
        "params": n_params, "layouts": {}, "skipped": [],
        "notes": ["valid_tokens_per_s counts the rows' prompt + response tokens (no padding); "
                  "mfu_valid_tokens = 6 (update) or 2 (log-prob pass) x params x valid tokens/s / 989e12"]}
    reference = None
    worker = None
    last_s = 0.0
    with recorded(args.out, result, wall_start):
        model_dir = write_random_model(args.shape, args.model_dir / args.shape)
        batch = long_tailed_batch(args, int(SHAPES[args.shape]["vocab_size"]))
        mask = batch["response_mask"].bool()
        lengths = batch["response_mask"].sum(1)
        result["batch"] = {"rows": args.rows, "valid_tokens": int(batch["attention_mask"].sum()),
                           "padded_tokens": int(batch["attention_mask"].numel()),
                           "response_len_median": int(lengths.median()), "response_len_max": int(lengths.max())}
        result["setup_s"] = time.perf_counter() - wall_start
        names = [x for x in args.layouts.split(",") if x]
        for attn in dict.fromkeys(LAYOUTS[n][2] for n in names):  # one worker per attention implementation
            group = [n for n in names if LAYOUTS[n][2] == attn]
            if time.perf_counter() - wall_start + 1.5 * last_s * len(group) > args.deadline_s:
                result["skipped"] += group
                continue
            t0 = time.perf_counter()
            worker = None
            gc.collect()
            if on_gpu:
                torch.cuda.empty_cache()
            worker = make_worker(model_dir, args, False, on_gpu, extra=[
                f"model.attn_implementation={attn}", f"actor.micro_batch_size_per_worker={args.micro_batch}"])
            old = {}
            for name in group:  # every log-prob pass before any update: the same weights (the freshly loaded ones)
                packed, use_budget, _ = LAYOUTS[name]
                use_layout(worker, packed, args.budget if use_budget else 0)
                lp = time_log_probs(worker, batch, n_params)
                old[name] = lp.pop("result")["old_log_probs"]
                reference = old[name] if reference is None else reference
                result["layouts"][name] = {"log_prob_pass": lp, "max_abs_log_prob_diff_vs_first": float(
                    (old[name] - reference)[mask].abs().max())}
            for name in group:
                packed, use_budget, _ = LAYOUTS[name]
                use_layout(worker, packed, args.budget if use_budget else 0)
                if attn == "flex_attention" and not on_gpu:
                    result["layouts"][name]["update"] = "skipped: FlexAttention has no backward on a CPU"
                    continue
                out = result["layouts"][name]
                out["update"] = time_update(worker, batch, old[name], n_params)
                print(f"{name}: log-probs {out['log_prob_pass']['mean_s']:.3f} s, update {out['update']['mean_s']:.3f}"
                      f" s (MFU on valid tokens {out['update']['mfu_valid_tokens']:.3f}), peak "
                      f"{out['update']['peak_allocated_gib']} GiB, max |dlogp| "
                      f"{out['max_abs_log_prob_diff_vs_first']:.3g}", flush=True)
                write(args.out, result)
            last_s = (time.perf_counter() - t0) / len(group)
    print(f"wrote {args.out} ({result['status']}; skipped {result['skipped']})", flush=True)
    exit_with_status(result)


if __name__ == "__main__":
    main()
