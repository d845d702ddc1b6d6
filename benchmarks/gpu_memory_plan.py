"""Allocator peaks of the real actor worker with gradient checkpointing on and off -> JSON (for the memory plan).

    python benchmarks/gpu_memory_plan.py OUT.json

gpu_update_mfu.py's worker and batch (Qwen2.5-1.5B shape, world size 1, bf16, hf engine, no reference, 64 rows of
256 + 1024 tokens); per case a warm-up pass and update, then one update and one old-log-prob pass, each with
torch.cuda.max_memory_allocated. The Config is built directly (no load_config). tests/unit/memory/test_memory_plan.py compares
results/gpu_memory_plan.json (this file's output on the H200) with the plan.
"""
import gc
import json
import sys
import types
from pathlib import Path

import torch

from reasonrl.bench.shapes import write_random_model  # noqa: E402
from reasonrl.bench.update_worker import synthetic_batch  # noqa: E402

import reasonrl.workers.actor_rollout_ref as worker_module  # noqa: E402
from reasonrl.config import Config  # noqa: E402

CASES = [(16, True), (64, True), (4, False)]
GIB = 2**30


def measure(model_dir: Path, batch, rows: int, checkpointing: bool) -> dict:
    """One case on a fresh worker: the update's and then the old-log-prob pass's allocator peak, GiB."""
    cfg = Config()
    cfg.model.path, cfg.model.dtype, cfg.model.gradient_checkpointing = str(model_dir), "bfloat16", checkpointing
    cfg.data.train_batch_size, cfg.rollout.n, cfg.data.max_prompt_length = 8, 8, 256
    cfg.rollout.max_new_tokens, cfg.rollout.engine, cfg.algorithm.use_kl_loss = 1024, "hf", False
    cfg.trainer.device, cfg.trainer.resume, cfg.actor.micro_batch_size_per_worker = "cuda", "never", rows
    from reasonrl.config.plan import RunPlan
    from reasonrl.hardware import local_hardware

    plan = RunPlan.build(cfg, local_hardware("cuda")).for_workers()
    worker = worker_module.ActorRolloutRefWorker(cfg, str(model_dir), 0, 1, "127.0.0.1", 29500 + rows, plan=plan)
    old = worker.compute_log_probs(batch)["old_log_probs"]
    train = batch.union(type(batch)({"old_log_probs": old}))
    worker.update_actor(train)  # warm-up: the AdamW moments exist from here on
    peaks = {}
    for name, call, data in (("update", worker.update_actor, train), ("log_probs", worker.compute_log_probs, batch)):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        call(data)
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() / GIB
    return peaks


def main(out: str) -> None:
    worker_module.from_dict = lambda cfg: cfg  # the worker gets the Config itself
    model_dir = write_random_model("qwen2.5-1.5b", Path("/tmp/reasonrl-bench-model/qwen2.5-1.5b"))
    batch = synthetic_batch(types.SimpleNamespace(rows=64, prompt_len=256, response_len=1024), 151936)
    result = {"benchmark": "gpu_memory_plan", "shape": "qwen2.5-1.5b", "rows": 64, "prompt_len": 256,
              "response_len": 1024, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "device_total_gib": torch.cuda.mem_get_info()[1] / GIB, "cases": {}}
    for rows, checkpointing in CASES:
        peaks = measure(model_dir, batch, rows, checkpointing)
        result["cases"][f"{rows}:{str(checkpointing).lower()}"] = {"rows_per_micro_batch": rows,
                                                                   "gradient_checkpointing": checkpointing,
                                                                   "peak_allocated_gib": peaks}
        print(rows, checkpointing, peaks, flush=True)
        Path(out).write_text(json.dumps(result, indent=1))
        gc.collect()  # the worker of this case is gone with measure's frame
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
