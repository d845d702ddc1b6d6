"""The plan's second step against the run's model, once its ``config.json`` is read (nothing is loaded):
``plan_with_model`` reads the model's facts, checks the context (``RunPlan.with_model``) and LoRA's target modules,
resolves the ``auto`` token budgets and, on a GPU, checks the memory plan (``reasonrl.memory``) on the device and on
the host."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Optional

from reasonrl.config import Config, ConfigError
from reasonrl.config.combinations import combination_problems
from reasonrl.config.model_facts import ModelFacts
from reasonrl.config.plan import RunPlan


def plan_with_model(cfg: Config, plan: RunPlan, model_path: str) -> RunPlan:
    """The final plan of ``cfg`` for the model in ``model_path`` (ConfigError naming the keys when the model does not
    fit the config: its context, LoRA's targets, the memory plan on a GPU)."""
    from reasonrl.memory import resolve_run_budgets
    from reasonrl.memory.auto import host_memory_bytes

    facts = ModelFacts.read(model_path, cfg.model.path)
    plan.with_model(facts)  # the context: checked before the memory plan reads the model
    check_lora_targets(cfg, model_path)
    budgets = {}
    if plan.batch.auto_budget_keys:  # against the device (a CPU's: the RAM its ranks share)
        budgets = resolve_run_budgets(plan.run_config(cfg), facts.require_config(), plan)
    plan = plan.with_model(facts, budgets)
    if plan.device == "cuda":  # will it fit? before anything loads
        import torch

        check_memory_plan(plan.run_config(cfg), plan, facts.require_config(),
                          torch.cuda.get_device_properties(0).total_memory, host_bytes=host_memory_bytes(),
                          ranks_on_host=min(plan.world_size, torch.cuda.device_count()))
    return plan


def check_lora_targets(cfg: Config, model_path: str) -> None:
    """With LoRA on, ConfigError naming ``actor.lora.target_modules`` when the model has no such projection (the
    model is built on the meta device from its config.json: nothing is loaded; ``models.lora.check_target_modules``)."""
    if cfg.actor.lora.rank <= 0:
        return
    from reasonrl.models.lora import LoraTargetError, check_target_modules

    try:
        check_target_modules(model_path, cfg.actor.lora.target_modules, cfg.model.trust_remote_code)
    except LoraTargetError as exc:
        message = str(exc).removeprefix("actor.lora.target_modules: ")
        raise ConfigError(f"config key 'actor.lora.target_modules': {message} ({cfg.model.path})") from None


def check_memory_plan(cfg: Config, plan: RunPlan, model_config: Mapping[str, Any], device_bytes: float,
                      echo=print, host_bytes: Optional[float] = None, ranks_on_host: Optional[int] = None) -> None:
    """The memory plan of ``cfg`` (the plan's ``run_config``: token budgets resolved) under ``plan``, printed;
    ConfigError naming the phases that do not fit, the numbers and what would make them fit, unless
    ``trainer.ignore_memory_plan``. Async mode plans a rollout worker's GPU too (with
    ``async_rollout.share_devices`` the replica's engine is in the actor's GPU plan, and the message names the
    engine's share). With ``host_bytes`` the host's
    memory is planned as well (``plan_host_memory``: offloaded shards, a sleeping engine) for ``ranks_on_host`` ranks
    (default all)."""
    from reasonrl.memory import GIB, fit_suggestions, plan_memory, plan_rollout_worker, render_plan
    from reasonrl.memory.shared_gpu import describe_share

    memory = plan_memory(cfg, model_config, device_bytes, plan)
    echo(render_plan(memory))
    separate = plan.is_async and not plan.share_devices  # shared: the replica's engine is in the plan above
    rollout = plan_rollout_worker(cfg, model_config, device_bytes, plan) if separate else None
    if rollout is not None:
        echo("rollout worker GPU (trainer.mode=async): " + render_plan(rollout))
        memory.phases += [replace(p, name=f"rollout worker {p.name}") for p in rollout.phases]
        memory.notes += rollout.notes
    if host_bytes is not None and not plan.is_async:
        _check_host_plan(cfg, plan, model_config, host_bytes, ranks_on_host, echo)
    if memory.fits or cfg.trainer.ignore_memory_plan:
        return
    over = ", ".join([f"{p.name} {p.total / GIB:.1f} GiB" for p in memory.phases if not p.fits] + memory.notes)
    fixes = fit_suggestions(cfg, model_config, device_bytes, plan)
    shared = f" ({describe_share(cfg, device_bytes, plan.replicas_per_device)})" if plan.share_devices else ""
    raise ConfigError(f"the memory plan does not fit the device's {device_bytes / GIB:.1f} GiB{shared}: {over}"
                      + (f"; each of these would make it fit: {', '.join(fixes)}" if fixes else
                         "; no single change makes it fit (more GPUs, a smaller model or shorter sequences)")
                      + "; trainer.ignore_memory_plan=true starts anyway")


def _check_host_plan(cfg: Config, plan: RunPlan, model_config: Mapping[str, Any], host_bytes: float,
                     ranks_on_host: Optional[int], echo) -> None:
    """The host half of ``check_memory_plan``: printed when anything is kept on the host; ConfigError when it passes
    Ray's kill threshold, naming the total, the limit and the single changes that bring it under."""
    from reasonrl.memory import GIB
    from reasonrl.memory.host import plan_host_memory, ray_kill_threshold, render_host_plan

    def host(c: Config):
        return plan_host_memory(c, model_config, host_bytes, plan.world_size, ranks_on_host, ray_kill_threshold())

    memory = host(cfg)
    if memory.terms:
        echo(render_host_plan(memory))
    if memory.fits or cfg.trainer.ignore_memory_plan:
        return
    trials = [("ref.param_dtype=auto", "ref", {"param_dtype": "auto"}),
              ("rollout.sleep_level=2", "rollout", {"sleep_level": 2}),
              ("actor.offload_optimizer=false", "actor", {"offload_optimizer": False}),
              ("actor.offload_params=false", "actor", {"offload_params": False}),
              ("ref.offload_params=false", "ref", {"offload_params": False})]
    fixes = []
    for text, section, change in trials:
        key, value = next(iter(change.items()))
        if getattr(getattr(cfg, section), key) == value:
            continue
        trial = replace(cfg, **{section: replace(getattr(cfg, section), **change)})
        if not combination_problems(trial) and host(trial).fits:
            fixes.append(text)
    raise ConfigError(f"the host memory plan does not fit: {memory.total / GIB:.1f} GiB kept on this host "
                      f"({', '.join(f'{k} {v / GIB:.1f}' for k, v in memory.terms.items())}) passes Ray's kill "
                      f"threshold {memory.threshold:.2f} x {memory.host_bytes / GIB:.1f} = {memory.limit / GIB:.1f} GiB"
                      + (f"; each of these would fit the host (check the GPU plan too): {', '.join(fixes)}" if fixes
                         else "; offload less or use more hosts") + "; trainer.ignore_memory_plan=true starts anyway")
