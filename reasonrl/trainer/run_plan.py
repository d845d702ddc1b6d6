"""What a run derives from its config before anything loads: the device, the data-parallel world size, the batch
sizes' table and checks, whether rollouts carry log-probs, whether offload is on, and whether a prompt and its
response fit the model's context. The trainer and ``reasonrl.train`` read these facts from here, not from the raw
config."""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional

import torch

from reasonrl.config import Config, ConfigError
from reasonrl.config.batch_plan import BatchPlan


def resolve_device(cfg: Config) -> str:
    if cfg.trainer.device != "auto":
        return cfg.trainer.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def world_size_for(cfg: Config, device: str) -> int:
    """Actor workers (data-parallel ranks); with trainer.mode=async the rollout workers' GPUs are not counted."""
    if cfg.trainer.num_workers:
        return cfg.trainer.num_workers
    rollout_gpus = cfg.async_rollout.num_rollout_workers if cfg.trainer.mode == "async" else 0
    return max(1, torch.cuda.device_count() - rollout_gpus) if device == "cuda" else 1


def batch_size_table(cfg: Config, world_size: int) -> List[tuple]:
    """The derived sizes printed at start-up (``BatchPlan.table``)."""
    return BatchPlan.from_config(cfg, world_size).table()


def rollout_logprobs_wanted(cfg: Config) -> bool:
    """Whether training rollouts ask the engine for log-probs (``rollout.logprobs``; None: only when TIS or the
    weight-sync check uses them)."""
    if cfg.rollout.logprobs is not None:
        return bool(cfg.rollout.logprobs)
    return cfg.algorithm.tis_mode != "off" or cfg.rollout.check_weight_sync


def offload_enabled(cfg: Config) -> bool:
    return any((cfg.actor.offload_params, cfg.actor.offload_optimizer, cfg.ref.offload_params,
                cfg.critic.offload_params, cfg.critic.offload_optimizer))


def slowest_rank(per_rank: List[Dict[str, float]]) -> Dict[str, float]:
    """The largest value of each key over the ranks (a phase lasts as long as its slowest rank)."""
    out: Dict[str, float] = {}
    for metrics in per_rank:
        for k, v in metrics.items():
            out[k] = max(out.get(k, v), v)
    return out


def check_context_length(cfg: Config, context: Optional[int]) -> None:
    """ConfigError naming the keys when a prompt and its response cannot fit the model's context (``context``:
    from its config.json; None: not stated, not checked)."""
    need = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    if context is not None and need > context:
        raise ConfigError(f"config key 'rollout.max_new_tokens': data.max_prompt_length ({cfg.data.max_prompt_length})"
                          f" + rollout.max_new_tokens ({cfg.rollout.max_new_tokens}) = {need} exceeds the model's "
                          f"context of {context} tokens ({cfg.model.path})")


def check_divisibility(cfg: Config, world_size: int) -> None:
    """Every rank gets the same work (``BatchPlan.check``): a ValueError naming the keys otherwise."""
    BatchPlan.from_config(cfg, world_size).check()


def model_config_json(model_path: str) -> Dict:
    """The model's ``config.json`` as a dict (read as JSON: nothing is loaded); ConfigError naming the file when it
    is missing or unreadable."""
    import json
    from pathlib import Path

    path = Path(model_path) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the memory plan needs the model's config.json: {path}: {exc}") from None


def check_memory_plan(cfg: Config, model_config: Dict, device_bytes: float, world_size: int,
                      echo=print) -> None:
    """The memory plan of this run (``reasonrl.memory``), printed; ConfigError naming the phases that do not fit, the
    numbers and what would make them fit, unless ``trainer.ignore_memory_plan``. ``*.max_tokens_per_micro_batch=auto``
    is resolved first, in ``cfg`` itself (``apply_auto_budgets``); async mode plans a rollout worker's GPU too."""
    from reasonrl.memory import GIB, Placement, apply_auto_budgets, fit_suggestions, plan_memory, plan_rollout_worker
    from reasonrl.memory import render_plan

    placement = Placement(world_size, cfg.rollout.tensor_parallel_size)
    apply_auto_budgets(cfg, model_config, device_bytes, placement, echo)
    plan = plan_memory(cfg, model_config, device_bytes, placement)
    echo(render_plan(plan))
    rollout = plan_rollout_worker(cfg, model_config, device_bytes) if cfg.trainer.mode == "async" else None
    if rollout is not None:
        echo("rollout worker GPU (trainer.mode=async): " + render_plan(rollout))
        plan.phases += [replace(p, name=f"rollout worker {p.name}") for p in rollout.phases]
        plan.notes += rollout.notes
    if plan.fits or cfg.trainer.ignore_memory_plan:
        return
    over = ", ".join([f"{p.name} {p.total / GIB:.1f} GiB" for p in plan.phases if not p.fits] + plan.notes)
    fixes = fit_suggestions(cfg, model_config, device_bytes, placement)
    raise ConfigError(f"the memory plan does not fit the device's {device_bytes / GIB:.1f} GiB: {over}"
                      + (f"; each of these would make it fit: {', '.join(fixes)}" if fixes else
                         "; no single change makes it fit (more GPUs, a smaller model or shorter sequences)")
                      + "; trainer.ignore_memory_plan=true starts anyway")
