"""``*.max_tokens_per_micro_batch=auto``: the largest token budget the memory plan says fits the device.

``resolve_auto_budgets`` is pure (the config, the model's ``config.json``, the device's bytes and the run's plan in;
key -> tokens out); ``resolve_run_budgets`` resolves a run's on its own device and says what it chose: the trainer
hands the result to the plan (``RunPlan.with_model``; the config is never written), ``python -m reasonrl.doctor
--plan`` prints it. ``device_memory_bytes`` is what "the device" is: a GPU's total
memory, or on a CPU the host's RAM shared by the ranks.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from reasonrl.config.load import ConfigError
from reasonrl.config.token_budget import auto_budget_keys, budget_value

from reasonrl.config.plan import RunPlan

from .plan import PhasePlan, _positive_number, one_gpu_plan, plan_memory
from .terms import GIB

AUTO_DEVICE_SHARE = 0.9
"""``auto`` picks the largest budget whose phases fit in this share of the device, not all of it: the plan misses
what it does not model (allocator fragmentation, the masked attention kernel of long-tailed padded rows: the
recorded update peaks of benchmarks/results/gpu_packing.json are 4-6% above the plan, docs/performance.md)."""


class AutoBudgetError(ConfigError):
    """``auto`` has no answer: even one row per micro-batch does not fit (the message names the key and phase)."""


def with_budgets(cfg: Any, budgets: Mapping[str, int]) -> Any:
    """A copy of ``cfg`` with these budgets (key -> tokens); ``cfg`` itself is unchanged."""
    out = cfg
    for key, tokens in budgets.items():
        section, name = key.split(".")
        out = replace(out, **{section: replace(getattr(out, section), **{name: tokens})})
    return out


def governed_phases(cfg: Any, key: str) -> Tuple[str, ...]:
    """The plan's phases whose micro-batches ``key``'s budget sets: the actor's the old log-probs and the update,
    and the reference's and the critic's passes where their own budget is 0 (they follow the actor's)."""
    if key == "ref.max_tokens_per_micro_batch":
        return ("reference",)
    if key == "critic.max_tokens_per_micro_batch":
        return ("values", "critic_update")
    phases = ["log_probs", "update"]
    if budget_value(cfg, "ref.max_tokens_per_micro_batch") == 0:
        phases.append("reference")
    if budget_value(cfg, "critic.max_tokens_per_micro_batch") == 0:
        phases += ["values", "critic_update"]
    return tuple(phases)


def resolve_auto_budgets(cfg: Any, model_config: Mapping[str, Any], device_bytes: Any,
                         plan: Optional[RunPlan] = None, share: float = AUTO_DEVICE_SHARE) -> Dict[str, int]:
    """For each budget set to ``auto``, the largest token count N (to the token) with which every phase it governs
    (``governed_phases``) has a planned ``total`` of at most ``share`` x ``device_bytes``, the rest of the config as
    it is. N is at least one longest row (data.max_prompt_length + rollout.max_new_tokens: a smaller budget runs
    rows alone anyway) and at most all of a worker's rows in one micro-batch; 0 where the config runs none of the
    phases (the budget is unused). AutoBudgetError naming the key and the phase when one row does not fit.
    The plan's total grows with N in every phase, so a binary search finds the edge."""
    keys = auto_budget_keys(cfg)
    if not keys:
        return {}
    dev = _positive_number(device_bytes, "device_bytes")
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    p = plan or one_gpu_plan(cfg)
    seq, rows = p.batch.longest_row, p.batch.rows_per_worker
    placeholder = with_budgets(cfg, {k: seq for k in keys})  # one row each: the other keys' phases are not judged
    limit = share * dev
    out: Dict[str, int] = {}
    for key in keys:
        names = governed_phases(cfg, key)

        def judged(tokens: int) -> List[PhasePlan]:
            plan = plan_memory(with_budgets(placeholder, {key: tokens}), model_config, dev, p)
            return [ph for ph in plan.phases if ph.name in names]

        def fits(tokens: int) -> bool:
            return all(ph.total <= limit for ph in judged(tokens))

        phases = judged(seq)
        if not phases:
            out[key] = 0
            continue
        if not fits(seq):
            worst = max(phases, key=lambda ph: ph.total)
            raise AutoBudgetError(
                f"config key '{key}': auto: not even one row of {seq} tokens fits: the {worst.name} phase needs "
                f"{worst.total / GIB:.2f} GiB of the {limit / GIB:.2f} GiB auto may use ({share:.0%} of "
                f"{dev / GIB:.2f} GiB); python -m reasonrl.doctor --plan lists what would make it fit")
        low, high = seq, rows * seq
        if fits(high):
            out[key] = high
            continue
        while high - low > 1:  # fits(low), not fits(high)
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        out[key] = low
    return out


def describe_budgets(budgets: Mapping[str, int], device_bytes: float, share: float = AUTO_DEVICE_SHARE) -> str:
    """One line saying what ``auto`` chose (printed at start-up and by ``doctor --plan``)."""
    chosen = ", ".join(f"{k}={v}" + (" (unused)" if v == 0 else "") for k, v in budgets.items())
    return (f"auto token budgets: {chosen} (the largest whose phases fit {share:.0%} of "
            f"{device_bytes / GIB:.1f} GiB)")


def host_memory_bytes() -> float:
    """This machine's RAM (``os.sysconf``: physical pages x page size), or the cgroup's memory limit
    (/sys/fs/cgroup/memory.max) when that is smaller."""
    total = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
    except OSError:
        return total
    return min(total, float(limit)) if limit.isdigit() else total


def device_memory_bytes(device: str, ranks_sharing: int = 1) -> float:
    """The memory the plan is measured against: a GPU's total (``torch.cuda``, device 0 of the process), or on a CPU
    the host's RAM divided by the ``ranks_sharing`` worker processes that share it (each rank is planned as a
    device of its own)."""
    if device == "cuda":
        import torch

        return float(torch.cuda.get_device_properties(0).total_memory)
    if device != "cpu":
        raise ValueError(f"device must be cuda or cpu, got {device!r}")
    if isinstance(ranks_sharing, bool) or not isinstance(ranks_sharing, int) or ranks_sharing < 1:
        raise ValueError(f"ranks_sharing must be a positive integer, got {ranks_sharing!r}")
    return host_memory_bytes() / ranks_sharing


def resolve_run_budgets(cfg: Any, model_config: Mapping[str, Any], plan: RunPlan,
                        echo: Optional[Callable[[str], Any]] = print) -> Dict[str, int]:
    """A run's ``auto`` budgets on its own device (``device_memory_bytes``; on a CPU the RAM of the plan's ranks),
    key -> tokens, for the plan's second step (``RunPlan.with_model``: the config is not written); ``echo``
    (None: silent) gets ``describe_budgets``' line. Nothing is read when no budget is ``auto``."""
    if not auto_budget_keys(cfg):
        return {}
    device_bytes = device_memory_bytes(plan.device, plan.world_size)
    budgets = resolve_auto_budgets(cfg, model_config, device_bytes, plan)
    if budgets and echo is not None:
        echo(describe_budgets(budgets, device_bytes))
    return budgets
