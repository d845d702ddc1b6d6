"""The real actor worker alone, in this process, for the update benchmarks (``benchmarks/gpu_update_mfu.py``,
``gpu_packing.py``, ``gpu_memory_plan.py``): built for the update only, a synthetic batch, and device-synchronised
timing with the allocator's peak."""
from __future__ import annotations

import argparse
import random
import socket
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch

from reasonrl.bench.shapes import SHAPES
from reasonrl.config import load_config, to_dict
from reasonrl.data import Batch
from reasonrl.data.collate import collate_rollout
from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker

GIB = float(1 << 30)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> Optional[float]:
    return torch.cuda.max_memory_allocated() / GIB if torch.cuda.is_available() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments every script built on ``make_worker`` and ``synthetic_batch`` takes (``--rows`` is each
    script's own): the shape, the rows' lengths, where the random model goes, config overrides and the output."""
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--prompt-len", type=int, default=None, help="default 256 (tiny: 32)")
    p.add_argument("--response-len", type=int, default=None, help="default 1024 (tiny: 96)")
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/reasonrl-bench-model"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for the worker, after the script's own (repeatable)")
    p.add_argument("--out", type=Path, required=True)


def fill_length_defaults(args: argparse.Namespace) -> None:
    """``--prompt-len`` and ``--response-len`` left unset: 256 and 1024 tokens, or 32 and 96 with ``--shape tiny``."""
    tiny = args.shape == "tiny"
    args.prompt_len = args.prompt_len or (32 if tiny else 256)
    args.response_len = args.response_len or (96 if tiny else 1024)


def make_worker(model_dir: Path, args, compile_layers: bool, on_gpu: bool,
                extra: Sequence[str] = ()) -> ActorRolloutRefWorker:
    """The real actor worker, world size 1, configured for the update only (no KL loss, so no reference model);
    ``extra``: more overrides (gpu_packing.py's attention implementation and micro-batch rows)."""
    rows_per_prompt = 8 if args.rows % 8 == 0 else 1
    overrides = [
        f"model.path={model_dir}", f"model.dtype={'bfloat16' if on_gpu else 'float32'}",
        "model.gradient_checkpointing=false",
        f"data.train_batch_size={args.rows // rows_per_prompt}", f"rollout.n={rows_per_prompt}",
        f"data.max_prompt_length={args.prompt_len}", f"rollout.max_new_tokens={args.response_len}",
        "rollout.engine=hf", "actor.ppo_mini_batch_size=0", "actor.lr=1e-6", f"actor.compile={compile_layers}",
        "algorithm.use_kl_loss=false", "algorithm.kl_in_reward=false", "algorithm.entropy_coef=0.0",
        "trainer.profile=none", "trainer.resume=never", f"trainer.device={'cuda' if on_gpu else 'cpu'}",
        "trainer.seed=1", *extra,
    ]
    cfg, _ = load_config(overrides, cuda_available=on_gpu)
    from reasonrl.config.plan import RunPlan
    from reasonrl.hardware import local_hardware

    plan = RunPlan.build(cfg, local_hardware(cfg.trainer.device)).for_workers()
    return ActorRolloutRefWorker(to_dict(cfg), str(model_dir), rank=0, world_size=1, master_addr="127.0.0.1",
                                 master_port=_free_port(), plan=plan)


def synthetic_batch(args, vocab: int) -> Batch:
    """``--rows`` rows of random prompt and response tokens (no EOS inside), GRPO-like advantages per row."""
    rng = random.Random(0)
    prompts = [[rng.randrange(1, vocab - 1) for _ in range(args.prompt_len)] for _ in range(args.rows)]
    responses = [[rng.randrange(1, vocab - 1) for _ in range(args.response_len)] for _ in range(args.rows)]
    batch = collate_rollout(prompts, responses, [[0.0] * args.response_len] * args.rows, pad_id=vocab - 1)
    advantages = torch.randn(args.rows, generator=torch.Generator().manual_seed(1))
    batch["advantages"] = advantages[:, None] * batch["response_mask"]
    batch["returns"] = batch["advantages"].clone()
    return batch


def timed(fn, repeats: int) -> Dict[str, Any]:
    """Run ``fn`` ``repeats`` times (device-synchronised); seconds per call, the peak memory, the last result."""
    sync()
    _reset_peak()
    seconds = []
    out = None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        sync()
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds, "mean_s": sum(seconds) / max(1, len(seconds)), "peak_allocated_gib": _peak_gib(),
            "result": out}
