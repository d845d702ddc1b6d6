"""The actor update's MFU on a random-weight Qwen2.5-1.5B-shaped model, per log-prob path and micro-batch -> JSON.

    python benchmarks/gpu_update_mfu.py --out results/gpu_update_mfu.json [--shape qwen2.5-1.5b] [--rows 64]

Runs the real ``ActorRolloutRefWorker`` in this process (world size 1: FSDP2 shard, fp32 master weights, bf16
compute, no gradient checkpointing, ``rollout.engine=hf`` only constructed; no vLLM, no Ray, no reference policy) on
a synthetic batch of ``--rows`` rows of ``--prompt-len`` random prompt tokens + ``--response-len`` response tokens.
Per variant it times:

- ``compute_log_probs`` (the old-log-prob pass: no grad, with entropy), one warm-up then ``--steps`` timed;
- ``update_actor`` (micro-batch forward + PPO-clip loss + backward, grad clip, AdamW step; one mini-batch = the whole
  batch), ``--warmup`` then ``--steps`` timed;

and reports seconds, tokens/s (all tokens, prompt included, as ``gpu_grpo_step.py`` counts them), MFU = 6 x params x
tokens/s over 989 TFLOP/s (H200 dense bf16; 2 x params for the no-grad pass) and the allocator's peak memory.

Variants: ``baseline`` (full logits for every position, ``fused=False``), ``fused`` (chunked log-probs through the
LM head, the default path), ``fused_compile`` (plus ``actor.compile``: regional torch.compile of the decoder
layers), each at every ``--micro-batches`` size. Results are written after every variant, so a run cut short keeps
what finished; ``--deadline-s`` skips variants that would not finish in time.

``--shape tiny`` runs the same code on a CPU (fp32) with small sizes, as a smoke test.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import sys
import time
from typing import Any, Dict, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import reasonrl.models.forward as forward_module  # noqa: E402
from reasonrl.bench.records import exit_with_status, recorded, write  # noqa: E402
from reasonrl.bench.shapes import H200_BF16_DENSE_FLOPS, SHAPES, parameter_count, write_random_model  # noqa: E402
from reasonrl.bench.update_worker import (GIB, add_worker_arguments, fill_length_defaults, make_worker,  # noqa: E402
                                          sync, synthetic_batch, timed)
from reasonrl.data import Batch  # noqa: E402
from reasonrl.workers.fsdp import (offload_fsdp_model, offload_optimizer, onload_fsdp_model,  # noqa: E402
                                   onload_optimizer)

PATHS = {  # variant name -> (fused log-probs, actor.compile)
    "baseline": (False, False),
    "fused": (True, False),
    "fused_compile": (True, True),
}


def run_variant(worker, batch: Batch, fused: bool, micro_batch: int, args, n_params: int) -> Dict[str, Any]:
    forward_module.FUSED_BY_DEFAULT = fused
    worker.batch_plan = dataclasses.replace(worker.batch_plan, micro_batch_rows=micro_batch)
    tokens = float(batch["attention_mask"].sum())
    start = time.perf_counter()

    timed(lambda: worker.compute_log_probs(batch), 1)  # warm-up (and compile)
    lp_run = timed(lambda: worker.compute_log_probs(batch), args.steps)
    old = lp_run.pop("result")
    lp_run["tokens_per_s"] = tokens / lp_run["mean_s"]
    lp_run["mfu"] = 2 * n_params * lp_run["tokens_per_s"] / H200_BF16_DENSE_FLOPS
    train_batch = batch.union(Batch({"old_log_probs": old["old_log_probs"]}))

    warm = timed(lambda: worker.update_actor(train_batch), args.warmup)
    upd = timed(lambda: worker.update_actor(train_batch), args.steps)
    metrics = upd.pop("result")
    upd["tokens_per_s"] = tokens / upd["mean_s"]
    upd["mfu"] = 6 * n_params * upd["tokens_per_s"] / H200_BF16_DENSE_FLOPS
    out = {"micro_batch": micro_batch, "fused": fused, "tokens": tokens,
           "update": upd, "update_warmup_s": warm["seconds"], "old_log_probs": lp_run,
           "actor_metrics": {k: float(v) for k, v in metrics.items()}, "variant_wall_s": time.perf_counter() - start}
    mask = batch["response_mask"].bool()
    out["old_log_probs_mean"] = float(old["old_log_probs"][mask].mean())
    out["entropy_mean"] = float(old["entropy"][mask].mean())
    return out


def path_check(worker, batch: Batch, rows: int) -> Dict[str, float]:
    """Fused vs full-logits log-probs and entropy of the same ``rows`` rows with the same weights (no grad)."""
    mb = batch.select(range(rows)).to(worker.device)
    args = (mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["responses"])
    worker.policy.model.eval()
    with torch.no_grad():
        lp0, ent0 = forward_module.response_log_probs(worker.policy.model, *args, with_entropy=True, fused=False)
        lp1, ent1 = forward_module.response_log_probs(worker.policy.model, *args, with_entropy=True, fused=True)
    return {"log_prob_max_abs_diff": float((lp0 - lp1).abs().max()),
            "log_prob_mean_abs_diff": float((lp0 - lp1).abs().mean()),
            "entropy_max_abs_diff": float((ent0 - ent1).abs().max()), "rows": rows}


def profile_update(worker, batch: Batch, rows: int) -> Dict[str, Any]:
    """torch.profiler over forward + backward of one micro-batch on the default (fused) path: the top operators."""
    from torch.profiler import ProfilerActivity, profile

    mb = batch.select(range(rows)).to(worker.device)
    args = (mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["responses"])
    on_gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    worker.policy.model.train()
    forward_module.response_log_probs(worker.policy.model, *args, fused=True)[0].sum().backward()  # warm
    worker.policy.optimizer.zero_grad(set_to_none=True)
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        lp, _ = forward_module.response_log_probs(worker.policy.model, *args, fused=True)
        (lp * mb["response_mask"]).sum().backward()
        sync()
        seconds = time.perf_counter() - start
    worker.policy.optimizer.zero_grad(set_to_none=True)
    sort_key = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
    return {"rows": rows, "seconds": seconds,
            "top_ops": prof.key_averages().table(sort_by=sort_key, row_limit=25, max_name_column_width=60)}


def offload_round_trip(worker, repeats: int = 2) -> Dict[str, Any]:
    """Seconds to move the actor's shards (+ gradients) and its AdamW state to pinned CPU memory and back, as
    ``actor.offload_params`` / ``actor.offload_optimizer`` do each step, and the device memory the offload frees."""
    def allocated() -> Optional[float]:
        return round(torch.cuda.memory_allocated() / GIB, 2) if torch.cuda.is_available() else None

    device = worker.device
    rounds = []
    for _ in range(repeats):
        before = allocated()
        off_params, off_optim = offload_fsdp_model(worker.policy.model), offload_optimizer(worker.policy.optimizer)
        during = allocated()
        on_params, on_optim = onload_fsdp_model(worker.policy.model, device), onload_optimizer(worker.policy.optimizer, device)
        rounds.append({"offload_params_s": off_params, "offload_optimizer_s": off_optim, "onload_params_s": on_params,
                       "onload_optimizer_s": on_optim, "allocated_gib_before": before,
                       "allocated_gib_offloaded": during, "allocated_gib_after": allocated()})
    return {"rounds": rounds, "last": rounds[-1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_worker_arguments(p)
    p.add_argument("--rows", type=int, default=None, help="rows in the update batch (default 64; tiny: 16)")
    p.add_argument("--micro-batches", default="8,16", help="comma-separated micro-batch sizes (rows)")
    p.add_argument("--variants", default=",".join(PATHS), help=f"comma-separated, from {', '.join(PATHS)}")
    p.add_argument("--warmup", type=int, default=1, help="untimed updates per variant")
    p.add_argument("--steps", type=int, default=2, help="timed updates (and no-grad passes) per variant")
    p.add_argument("--profile", type=lambda s: s.lower() == "true", default=True,
                   help="profile one fused micro-batch forward + backward (top operators)")
    p.add_argument("--deadline-s", type=float, default=220.0, help="skip variants that would end after this")
    args = p.parse_args()
    fill_length_defaults(args)
    args.rows = args.rows or (16 if args.shape == "tiny" else 64)

    on_gpu = torch.cuda.is_available()
    wall_start = time.perf_counter()
    n_params = parameter_count(args.shape)
    result: Dict[str, Any] = {
        "benchmark": "gpu_update_mfu", "status": "running", "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if on_gpu else None, "cpus": os.cpu_count()},
        "params": n_params, "target_update_mfu": 0.40, "variants": {}, "skipped": [],
        "notes": ["tokens count prompt + response tokens of every row (as gpu_grpo_step.py); MFU = 6 x params x "
                  "tokens/s / 989e12 for the update, 2 x params for the no-grad log-prob pass",
                  "update = micro-batch forward + PPO-clip loss + backward over the batch, grad clip, one AdamW step",
                  "peak_allocated_gib: torch's allocator peak during the timed calls (the hf engine's bf16 copy "
                  "of the weights included)"],
    }
    micro_batches = [int(x) for x in args.micro_batches.split(",") if x]
    variants = [v for v in args.variants.split(",") if v]
    worker = None
    worker_compiled: Optional[bool] = None
    with recorded(args.out, result, wall_start):
        t0 = time.perf_counter()
        model_dir = write_random_model(args.shape, args.model_dir / args.shape)
        result["setup_s"] = {"write_model": time.perf_counter() - t0}
        vocab = int(SHAPES[args.shape]["vocab_size"])
        batch = synthetic_batch(args, vocab)
        write(args.out, result)
        last_variant_s = 0.0
        for name in variants:
            fused, compile_layers = PATHS[name]
            for mb in micro_batches:
                key = f"{name}_mb{mb}"
                elapsed = time.perf_counter() - wall_start
                if elapsed + 1.2 * last_variant_s > args.deadline_s:
                    result["skipped"].append(key)
                    print(f"skip {key}: {elapsed:.0f} s elapsed, deadline {args.deadline_s:.0f} s", flush=True)
                    continue
                if worker_compiled is not compile_layers:
                    if worker is not None and args.profile and "profile" not in result and not worker_compiled:
                        result["profile"] = profile_update(worker, batch, micro_batches[0])
                    if worker is not None and "offload" not in result:
                        result["offload"] = offload_round_trip(worker)
                        print("offload " + json.dumps(result["offload"]["last"]), flush=True)
                    worker = None
                    gc.collect()
                    if on_gpu:
                        torch.cuda.empty_cache()
                    t0 = time.perf_counter()
                    worker = make_worker(model_dir, args, compile_layers, on_gpu, extra=args.set)
                    worker_compiled = compile_layers
                    result["setup_s"][f"worker_init_compile={compile_layers}"] = time.perf_counter() - t0
                    if "path_check" not in result:
                        result["path_check"] = path_check(worker, batch, min(micro_batches[0], args.rows))
                t0 = time.perf_counter()
                out = run_variant(worker, batch, fused, mb, args, n_params)
                last_variant_s = time.perf_counter() - t0
                result["variants"][key] = out
                print(f"{key}: update {out['update']['mean_s']:.3f} s, {out['update']['tokens_per_s']:.0f} tok/s, "
                      f"MFU {out['update']['mfu']:.3f}, peak {out['update']['peak_allocated_gib']} GiB; "
                      f"old log-probs {out['old_log_probs']['mean_s']:.3f} s (MFU {out['old_log_probs']['mfu']:.3f})"
                      f"; warm-up {out['update_warmup_s']}", flush=True)
                write(args.out, result)
        if worker is not None and args.profile and "profile" not in result and not worker_compiled:
            result["profile"] = profile_update(worker, batch, micro_batches[0])
        if worker is not None and "offload" not in result:
            result["offload"] = offload_round_trip(worker)
        result["imported_vllm_or_ray"] = sorted({m.split(".")[0] for m in sys.modules} & {"vllm", "ray"})
    forward_module.FUSED_BY_DEFAULT = True
    best = {k: v["update"]["mfu"] for k, v in result["variants"].items()}
    result["update_mfu_by_variant"] = best
    write(args.out, result)
    print("SUMMARY " + json.dumps({"update_mfu": best, "path_check": result.get("path_check"),
                                   "skipped": result["skipped"], "wall_s": result["wall_s"]}), flush=True)
    if "profile" in result:
        print(result["profile"]["top_ops"][:4000], flush=True)
    print(f"wrote {args.out} ({result['status']})", flush=True)
    exit_with_status(result)


if __name__ == "__main__":
    main()
