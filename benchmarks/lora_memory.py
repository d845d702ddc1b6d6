"""LoRA vs full fine-tuning on the CPU with the real SmolLM2-135M: what the actor, the reference and the optimizer
hold, and what a weight sync moves and how long it takes.

    python benchmarks/lora_memory.py [--rank 16] [--repeats 3]

Runs the real ``ActorRolloutRefWorker`` in this process (world size 1, FSDP2 on gloo, the hf engine), once without
LoRA and once with ``actor.lora.rank``, both with a KL term (so a reference policy exists), and after one update
counts the bytes of the tensors each part holds (parameters, gradients, AdamW state; a model shared by the actor and
the reference counted once) and times ``sync_weights`` (adapter-only and merged, against the full sync). Writes
``benchmarks/results/lora_memory.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MIB = 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensor_bytes(tensors) -> int:
    """Bytes of distinct storages (a tensor seen twice, e.g. tied or shared weights, counts once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        key = local.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += local.untyped_storage().nbytes()
    return total


def make_worker(model_path: str, extra: List[str]):
    from reasonrl.config import load_config, to_dict
    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg, _ = load_config(["rollout.engine=hf", "trainer.device=cpu", "actor.lr=1e-4", "data.train_batch_size=2",
                          "rollout.n=2", "actor.micro_batch_size_per_worker=4", "algorithm.use_kl_loss=true",
                          "model.dtype=float32", *extra], cuda_available=False)
    from reasonrl.config.plan import RunPlan

    return ActorRolloutRefWorker(to_dict(cfg), model_path, rank=0, world_size=1, master_addr="127.0.0.1",
                                 master_port=free_port(), num_threads=int(os.environ.get("BENCH_THREADS", "2")),
                                 plan=RunPlan.build(cfg).for_workers())


def batch():
    from reasonrl.data.collate import collate_rollout

    prompts = [list(range(10, 42)), list(range(10, 42)), list(range(50, 82)), list(range(50, 82))]
    responses = [list(range(100, 132))] * 4
    b = collate_rollout(prompts, responses, [[0.0] * 32] * 4, pad_id=0)
    b["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * b["response_mask"]
    return b


def measure(model_path: str, extra: List[str], repeats: int) -> Dict[str, float]:
    """One worker's memory after an update and its sync times."""
    from reasonrl.workers.actor_update import policy_update

    start = time.perf_counter()
    worker = make_worker(model_path, extra)
    init_s = time.perf_counter() - start
    b = batch()
    b = b.union(worker.compute_log_probs(b)).union(worker.compute_ref_log_probs(b))
    policy_update(worker.policy, b, 0.001)  # leaves the gradients in place, so they are counted
    actor_params = list(worker.policy.model.parameters())
    ref_params = [] if worker.ref_policy.model is worker.policy.model else list(worker.ref_policy.model.parameters())
    optim_state = [v for s in worker.policy.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    grads = [p.grad for p in actor_params]
    out = {
        "init_s": round(init_s, 1),
        "actor_param_mib": tensor_bytes(actor_params) / MIB,
        "trainable_param_mib": tensor_bytes([p for p in actor_params if p.requires_grad]) / MIB,
        "ref_param_mib": tensor_bytes(ref_params) / MIB,
        "grad_mib": tensor_bytes(grads) / MIB,
        "optimizer_state_mib": tensor_bytes(optim_state) / MIB,
        "optimizer_tensors": len(optim_state),
    }
    out["actor_ref_optimizer_mib"] = out["actor_param_mib"] + out["ref_param_mib"] + out["optimizer_state_mib"]
    syncs = [worker.sync_weights() for _ in range(repeats)]
    out["sync_bytes"] = syncs[0]["bytes"]
    out["sync_mib"] = syncs[0]["bytes"] / MIB
    out["sync_s"] = [round(s["seconds"], 4) for s in syncs]
    out["sync_s_median"] = statistics.median(s["seconds"] for s in syncs)
    check = worker.check_weight_sync(list(range(10, 20)), list(range(100, 120)))
    out["check_logprob_diff_max"] = check["weight_sync/logprob_diff_max"]
    if "weight_sync/engine_vs_base_max" in check:
        out["check_engine_vs_base_max"] = check["weight_sync/engine_vs_base_max"]
    worker.host.engine.shutdown()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="syncs timed per variant (median reported)")
    parser.add_argument("--out", default=str(RESULTS / "lora_memory.json"))
    parser.add_argument("--variants", nargs="+", default=["full", "adapter_only", "merged"],
                        help="which to run (the summary needs full and adapter_only)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from reasonrl.models import resolve_model_path

    model_path = resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    variants = {
        "full": [],
        f"lora_r{args.rank}_adapter_only": [f"actor.lora.rank={args.rank}"],
        f"lora_r{args.rank}_merged": [f"actor.lora.rank={args.rank}", "actor.lora.merge_for_rollout=true"],
    }
    wanted = {"full": "full", f"lora_r{args.rank}_adapter_only": "adapter_only", f"lora_r{args.rank}_merged": "merged"}
    variants = {k: v for k, v in variants.items() if wanted[k] in args.variants}
    results = {}
    for name, extra in variants.items():
        print(f"-- {name}", flush=True)
        results[name] = measure(model_path, extra, args.repeats)
        print(json.dumps(results[name]), flush=True)
    if "full" not in results or f"lora_r{args.rank}_adapter_only" not in results:
        print("no summary: it compares full with adapter_only (both printed above)")
        return 0
    full, lora = results["full"], results[f"lora_r{args.rank}_adapter_only"]
    summary = {
        "actor_ref_optimizer_mib": {"full": full["actor_ref_optimizer_mib"], "lora": lora["actor_ref_optimizer_mib"]},
        "saved_mib": full["actor_ref_optimizer_mib"] - lora["actor_ref_optimizer_mib"],
        "saved_by_the_shared_reference_mib": full["ref_param_mib"] - lora["ref_param_mib"],
        "saved_by_the_optimizer_mib": full["optimizer_state_mib"] - lora["optimizer_state_mib"],
        "sync_bytes_ratio_full_over_adapter": full["sync_bytes"] / lora["sync_bytes"],
        "sync_s_median": {"full": full["sync_s_median"], "adapter_only": lora["sync_s_median"],
                          "merged": results.get(f"lora_r{args.rank}_merged", {}).get("sync_s_median")},
    }
    result = {"benchmark": "lora_memory", "model": "SmolLM2-135M-Instruct", "device": "cpu", "dtype": "float32",
              "engine": "hf", "lora_rank": args.rank, "lora_targets": "default (every decoder-layer projection)",
              "what": "bytes of the tensors each part holds after one update (FSDP2 world size 1: the full model), "
                      "and sync_weights into the colocated hf engine",
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "threads": int(os.environ.get("BENCH_THREADS", "2"))},
              "command": "python benchmarks/lora_memory.py " + " ".join(sys.argv[1:]),
              "summary": summary, "variants": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
