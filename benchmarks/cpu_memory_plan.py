"""The memory plan's parameter, optimizer and activation terms against the measured memory of the real actor worker
on the CPU (real SmolLM2-135M, float32, world size 1, gloo, hf engine, no reference) -> JSON.

    python benchmarks/cpu_memory_plan.py [OUT.json] [--rows 8] [--prompt-len 64] [--response-len 64]
                                         [--micro-batches 2 8] [--threads 2]

What is measured, and how honestly: the process's resident set size (RSS, /proc/self/status), not an allocator's
count (torch's CPU allocator keeps no statistics, and tracemalloc sees only Python's own allocations, not tensors).
Two things make RSS follow the live tensors: glibc's mmap threshold is pinned at 128 KiB (``mallopt``) before
anything allocates, so every tensor above that is a mapping of its own and goes back to the system when freed; and a
phase's peak is VmHWM after writing 5 to /proc/self/clear_refs (which resets the high-water mark to the current RSS
just before the phase). What remains in the figures beyond tensors: smaller allocations in glibc's arenas, the
model loader's caches, page-granular rounding. So each figure is compared with the plan's terms as a difference:

- parameters: RSS after the worker is built less RSS before it, against the plan's actor weights (fp32, 4P) plus
  the hf engine's copy (P x 4 bytes on a CPU);
- optimizer: RSS after the first update less RSS before it (the update frees its gradients and activations), against
  the AdamW moments (8P);
- update at two micro-batch sizes (rows x the longest row, tokens N): the peak during a later update less RSS before
  it, against the plan's update terms that come and go (gradients, the unsharded root, FSDP layers in flight,
  activations, the log-prob head);
- activations per token: the difference of the two update peaks over the difference in N, against the plan's.

Each update runs on the same worker (its micro-batch rows changed between them), after one warm-up update.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import random
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024)  # before torch allocates anything

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
from reasonrl.config import load_config, to_dict  # noqa: E402
from reasonrl.data.collate import collate_rollout  # noqa: E402
from reasonrl.config.model_facts import ModelFacts  # noqa: E402
from reasonrl.config.plan import RunPlan  # noqa: E402
from reasonrl.memory import GIB, plan_memory  # noqa: E402
from reasonrl.memory.auto import host_memory_bytes  # noqa: E402
from reasonrl.models import resolve_model_path  # noqa: E402

MIB = 2**20
RESIDENT = ("actor weights (fp32 shards)", "actor AdamW moments (2 x fp32)", "engine weights (hf copy)")


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: resident now, VmHWM: the high-water mark)."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def rss() -> float:
    return status_kib("VmRSS") * 1024.0


def phase_peak(fn: Callable[[], Any]) -> Dict[str, float]:
    """Run ``fn`` with the high-water mark reset just before: RSS before, the peak during, RSS after (bytes)."""
    before = rss()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = time.perf_counter()
    fn()
    return {"rss_before": before, "peak": status_kib("VmHWM") * 1024.0, "rss_after": rss(),
            "seconds": time.perf_counter() - start}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def overrides(model_path: str, args, micro_batch: int):
    rows_per_prompt = 2
    return [f"model.path={model_path}", "model.dtype=float32", "model.gradient_checkpointing=false",
            f"data.train_batch_size={args.rows // rows_per_prompt}", f"rollout.n={rows_per_prompt}",
            f"data.max_prompt_length={args.prompt_len}", f"rollout.max_new_tokens={args.response_len}",
            f"eval.max_new_tokens={args.response_len}", "rollout.engine=hf", "actor.ppo_mini_batch_size=0",
            "actor.lr=1e-6", "algorithm.use_kl_loss=false", "algorithm.kl_in_reward=false",
            "algorithm.entropy_coef=0.0", f"actor.micro_batch_size_per_worker={micro_batch}", "trainer.profile=none",
            "trainer.resume=never", "trainer.device=cpu", "trainer.seed=1"]


def synthetic_batch(rows: int, prompt_len: int, response_len: int, vocab: int):
    """Full-length random rows (no padding: every micro-batch is rows x the longest row), GRPO-like advantages."""
    rng = random.Random(0)
    prompts = [[rng.randrange(1, vocab - 1) for _ in range(prompt_len)] for _ in range(rows)]
    responses = [[rng.randrange(1, vocab - 1) for _ in range(response_len)] for _ in range(rows)]
    batch = collate_rollout(prompts, responses, [[0.0] * response_len] * rows, pad_id=vocab - 1)
    advantages = torch.randn(rows, generator=torch.Generator().manual_seed(1))
    batch["advantages"] = advantages[:, None] * batch["response_mask"]
    return batch


def transient(terms: Dict[str, float]) -> float:
    return sum(v for k, v in terms.items() if k not in RESIDENT)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="?", default=str(ROOT / "benchmarks" / "results" / "cpu_memory_plan.json"))
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--response-len", type=int, default=64)
    p.add_argument("--micro-batches", type=int, nargs=2, default=[2, 8], help="rows per micro-batch, two sizes")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker

    model_path = resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")  # converted once, before the baseline
    model_config = ModelFacts.read(model_path).require_config()
    small, large = args.micro_batches
    cfg, _ = load_config(overrides(model_path, args, small), cuda_available=False)
    configs = {m: load_config(overrides(model_path, args, m), cuda_available=False)[0] for m in (small, large)}
    plans = {m: plan_memory(c, model_config, host_memory_bytes(), RunPlan.build(c)) for m, c in configs.items()}
    batch = synthetic_batch(args.rows, args.prompt_len, args.response_len, model_config["vocab_size"])
    load_before = os.getloadavg()

    holder: Dict[str, Any] = {}
    built = phase_peak(lambda: holder.setdefault("w", ActorRolloutRefWorker(
        to_dict(cfg), model_path, rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(),
        num_threads=args.threads, plan=RunPlan.build(cfg).for_workers())))
    worker = holder["w"]
    print(f"worker built: RSS {built['rss_after'] / GIB:.2f} GiB", flush=True)
    first = phase_peak(lambda: worker.update_actor(batch))  # the AdamW moments exist from here on
    print(f"first update: {first['seconds']:.0f} s, RSS {first['rss_after'] / GIB:.2f} GiB", flush=True)
    updates = {}
    for m in (small, large):
        worker.batch_plan = replace(worker.batch_plan, micro_batch_rows=m)
        worker.cfg.actor.micro_batch_size_per_worker = m
        updates[m] = phase_peak(lambda: worker.update_actor(batch))
        print(f"update, {m} rows per micro-batch: peak {updates[m]['peak'] / GIB:.2f} GiB, "
              f"{updates[m]['seconds']:.0f} s", flush=True)

    rollout = plans[small].phase("rollout").terms
    seq = args.prompt_len + args.response_len

    def row(name: str, predicted: float, measured: float, rule: str) -> Dict[str, Any]:
        return {"term": name, "rule": rule, "predicted_mib": round(predicted / MIB, 1),
                "measured_mib": round(measured / MIB, 1), "error": round(measured / predicted - 1, 3)}

    rows = [row("parameters", rollout["actor weights (fp32 shards)"] + rollout["engine weights (hf copy)"],
                built["rss_after"] - built["rss_before"], "4P actor (fp32) + 4P hf engine copy"),
            row("optimizer", rollout["actor AdamW moments (2 x fp32)"], first["rss_after"] - first["rss_before"],
                "8P AdamW moments")]
    for m in (small, large):
        terms = plans[m].phase("update").terms
        rows.append(row(f"update transient, {m} rows x {seq} tokens", transient(terms),
                        updates[m]["peak"] - updates[m]["rss_before"],
                        "gradients 4P + root + FSDP layers + activations + log-prob head"))
    dn = (large - small) * seq
    slope_pred = (transient(plans[large].phase("update").terms) - transient(plans[small].phase("update").terms)) / dn
    slope_meas = ((updates[large]["peak"] - updates[large]["rss_before"])
                  - (updates[small]["peak"] - updates[small]["rss_before"])) / dn
    rows.append({"term": "update bytes per token (activations + head)", "predicted_bytes": round(slope_pred),
                 "measured_bytes": round(slope_meas), "error": round(slope_meas / slope_pred - 1, 3)})
    result = {
        "benchmark": "cpu_memory_plan", "model": "HuggingFaceTB/SmolLM2-135M-Instruct (packaged)",
        "parameters": plans[small].parameters, "dtype": "float32", "rows": args.rows, "prompt_len": args.prompt_len,
        "response_len": args.response_len, "micro_batches": [small, large], "threads": args.threads,
        "measures": "process RSS (/proc/self/status VmRSS; phase peak VmHWM after clear_refs 5), glibc mmap "
                    "threshold 128 KiB",
        "comparison": rows,
        "plan_update_terms_mib": {m: {k: round(v / MIB, 1) for k, v in plans[m].phase("update").terms.items()}
                                  for m in (small, large)},
        "phases": {"build": built, "first_update": first, **{f"update_{m}": updates[m] for m in (small, large)}},
        "host": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                 "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "torch": torch.__version__},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python", *sys.argv]),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
