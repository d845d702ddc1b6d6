"""What a training worker reads from the run's plan: built once on the driver (``RunPlan.for_workers``) and handed
to every worker with its config, so that no worker re-derives the mode, the generator or the batch sizes from the
raw config. A worker built on its own (tests, benchmarks) gets ``WorkerPlan.from_config``, the same rules."""
from __future__ import annotations

from dataclasses import dataclass

from .batch_plan import BatchPlan


@dataclass(frozen=True)
class WorkerPlan:
    """The facts of the run that a worker acts on (see the module docstring)."""

    batch: BatchPlan
    """Every batch size (the worker's mini- and micro-batches)."""
    hosts_engine: bool
    """The actor worker holds the rollout engine (colocated); False in async mode, where rollout workers generate."""
    tools: bool
    """Rollouts run the multi-turn tool loop around the engine (``RunPlan.generator == "tools"``)."""
    engine_sleep_level: int = 1
    """What the colocated vLLM engine's sleep does with its weights (``engine_sleep_level``)."""
    bucket_bytes: int = 32 << 20
    """Bytes per weight-sync bucket (``weight_sync_bucket_bytes``)."""

    @classmethod
    def from_config(cls, cfg, world_size: int) -> "WorkerPlan":
        """The plan of a worker that stands alone (``RunPlan.build`` decides these facts the same way)."""
        return cls(batch=BatchPlan.from_config(cfg, world_size), hosts_engine=cfg.trainer.mode != "async",
                   tools=cfg.tool.enabled, engine_sleep_level=engine_sleep_level(cfg),
                   bucket_bytes=weight_sync_bucket_bytes(cfg))


def weight_sync_bucket_bytes(cfg) -> int:
    """``rollout.weight_sync_bucket_mb`` (MiB) in bytes: the one conversion, for the workers (through the plan) and the
    memory plans."""
    return int(cfg.rollout.weight_sync_bucket_mb * (1 << 20))


def engine_sleep_level(cfg) -> int:
    """``rollout.sleep_level`` resolved: 1 (a host copy of the weights) when a sync sends only the LoRA adapter, else
    2 (the weights are discarded: every sync refills all of them, so a host copy would only cost host memory and
    two copies per step); an explicit 1 or 2 as set (``combinations`` refuses 2 with an adapter-only sync)."""
    if cfg.rollout.sleep_level:
        return cfg.rollout.sleep_level
    return 1 if adapter_only_sync(cfg) else 2


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


def adapter_only_sync(cfg) -> bool:
    """Whether weight syncs send the LoRA adapter alone (``actor.lora.rank`` > 0 and not ``merge_for_rollout``)."""
    return cfg.actor.lora.rank > 0 and not cfg.actor.lora.merge_for_rollout
