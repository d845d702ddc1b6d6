"""What the plan says to a person: the text table, and what would make an over-full layout fit."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, List, Mapping, Optional

from reasonrl.config.plan import RunPlan

from .plan import MemoryPlan, one_gpu_plan, plan_memory
from .terms import GIB

def render_plan(plan: MemoryPlan) -> str:
    """The plan as a text table: one row per term, one column per phase, GiB; then totals and fits."""
    names = [p.name for p in plan.phases]
    terms: List[str] = []
    for p in plan.phases:
        terms += [t for t in p.terms if t not in terms]
    width = max(len(t) for t in terms + ["CUDA context (per process)"]) + 2
    cols = max(12, *(len(n) + 2 for n in names))
    lines = [f"memory plan per GPU (GiB of {plan.device_bytes / GIB:.1f}), {plan.parameters / 1e9:.2f}B parameters",
             "".ljust(width) + "".join(n.rjust(cols) for n in names)]
    for t in terms:
        cells = [f"{p.terms[t] / GIB:.2f}" if t in p.terms else "-" for p in plan.phases]
        lines.append(t.ljust(width) + "".join(c.rjust(cols) for c in cells))
    lines.append("CUDA context (per process)".ljust(width) + "".join(f"{p.overhead / GIB:.2f}".rjust(cols)
                                                                   for p in plan.phases))
    lines.append("total".ljust(width) + "".join(f"{p.total / GIB:.2f}".rjust(cols) for p in plan.phases))
    lines.append("fits".ljust(width) + "".join(("yes" if p.fits else "NO").rjust(cols) for p in plan.phases))
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _with(cfg: Any, section: str, **changes: Any) -> Any:
    return replace(cfg, **{section: replace(getattr(cfg, section), **changes)})


def largest_fitting_token_budget(cfg: Any, model_config: Mapping[str, Any], device_bytes: Any,
                                 plan: Optional[RunPlan] = None, step: int = 256) -> int:
    """The largest ``actor.max_tokens_per_micro_batch`` (a multiple of ``step``, at least one longest row) with which
    every phase fits, the other settings unchanged; 0 when even one row per micro-batch does not fit."""
    p = plan or one_gpu_plan(cfg)
    seq, rows = p.batch.longest_row, p.batch.rows_per_worker

    def fits(budget: int) -> bool:
        trial = _with(cfg, "actor", max_tokens_per_micro_batch=budget)
        return plan_memory(trial, model_config, device_bytes, p).fits

    low = -(-seq // step) * step
    if not fits(low):
        return 0
    high = max(low, -(-rows * seq // step) * step)
    if fits(high):
        return high
    while high - low > step:  # fits(low), not fits(high)
        mid = (low + high) // 2 // step * step
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def fit_suggestions(cfg: Any, model_config: Mapping[str, Any], device_bytes: Any,
                    plan: Optional[RunPlan] = None) -> List[str]:
    """What would make an over-full layout fit, each change tried alone: a token budget, gradient checkpointing,
    offloading the optimizer / actor / reference, a lower engine share (``async_rollout.engine_memory_fraction`` on a
    GPU shared with a replica). Empty when it fits already."""
    p = plan or one_gpu_plan(cfg)
    if plan_memory(cfg, model_config, device_bytes, p).fits:
        return []
    out: List[str] = []
    budget = largest_fitting_token_budget(cfg, model_config, device_bytes, p)
    if budget:
        out.append(f"actor.max_tokens_per_micro_batch={budget}")
    trials = [("model.gradient_checkpointing=true", "model", {"gradient_checkpointing": True}),
              ("actor.offload_optimizer=true", "actor", {"offload_optimizer": True}),
              ("actor.offload_params=true", "actor", {"offload_params": True}),
              ("ref.offload_params=true", "ref", {"offload_params": True})]
    for text, section, change in trials:
        if not getattr(getattr(cfg, section), next(iter(change))):
            if plan_memory(_with(cfg, section, **change), model_config, device_bytes, p).fits:
                out.append(text)
    if p.share_devices:  # the replica's share of the GPU (shared_gpu.py); rollout.gpu_memory_utilization is not used
        for lower in (0.4, 0.3, 0.2, 0.1):
            if lower < cfg.async_rollout.engine_memory_fraction and plan_memory(
                    _with(cfg, "async_rollout", engine_memory_fraction=lower), model_config, device_bytes, p).fits:
                out.append(f"async_rollout.engine_memory_fraction={lower}")
                break
        return out
    util = cfg.rollout.gpu_memory_utilization
    for lower in (0.4, 0.3, 0.2):
        if lower < util and plan_memory(_with(cfg, "rollout", gpu_memory_utilization=lower), model_config,
                                        device_bytes, p).fits:
            out.append(f"rollout.gpu_memory_utilization={lower}")
            break
    return out
