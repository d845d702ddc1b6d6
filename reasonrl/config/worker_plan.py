"""What a training worker reads from the run's plan: built once on the driver (``RunPlan.for_workers``,
``reasonrl.config.plan``) and handed to every worker with the plan's config (``RunPlan.run_config``), so that no worker
re-derives the device, the engine, the mode, the generator, the weight sync or the batch sizes from the raw config.
A worker built on its own (tests, benchmarks) gets the same: ``RunPlan.build(cfg, hardware).for_workers()``."""
from __future__ import annotations

from dataclasses import dataclass

from .batch_plan import BatchPlan


@dataclass(frozen=True)
class WorkerPlan:
    """The facts of the run that a worker acts on (see the module docstring)."""

    batch: BatchPlan
    """Every batch size (the worker's mini- and micro-batches)."""
    device: str
    """``cpu`` or ``cuda`` (``RunPlan.device``)."""
    engine: str
    """The rollout engine, ``auto`` resolved (``RunPlan.engine``)."""
    hosts_engine: bool
    """The actor worker holds the rollout engine (colocated); False in async mode, where rollout workers generate."""
    tools: bool
    """Rollouts run the multi-turn tool loop around the engine (``RunPlan.generator == "tools"``)."""
    engine_sleep_level: int
    """What the colocated vLLM engine's sleep does with its weights (``RunPlan.engine_sleep_level``)."""
    lora_sync: str
    """``off``, ``adapter`` or ``merged`` (``RunPlan.lora_sync``)."""
    bucket_bytes: int
    """Bytes per weight-sync bucket (``RunPlan.bucket_bytes``)."""
    max_model_len: int
    """The engine's context (``RunPlan.max_model_len``)."""


ADAMW_IMPLS = ("auto", "fused", "foreach", "for_loop")
"""``actor.adamw_impl``'s values."""


def adamw_impl(cfg, device: str) -> str:
    """``actor.adamw_impl`` resolved for ``device`` ("cuda" or "cpu"): auto is fused on CUDA (one kernel per group of
    parameters, no temporaries beside the moments) and torch's own default elsewhere, the for-loop (torch takes
    foreach only when every tensor is on an accelerator); an explicit value as set."""
    impl = cfg.actor.adamw_impl
    if impl != "auto":
        return impl
    return "fused" if device == "cuda" else "for_loop"
