"""What a run derives from its config before anything loads, resolved once: the ``RunPlan``.

``RunPlan.build(cfg)`` (called by ``reasonrl.train`` before Ray starts) decides the device, the data-parallel world
size, the batch plan, which passes run, the sampling of training and validation rollouts, the generator (plain or the
tool loop), the mode and the placement numbers, and runs every rule between features
(``reasonrl.config.combinations``): an unsupported combination fails there, naming the keys. The trainer, its rollout
source and the start-up table read these facts from the plan, not from the raw config. The checks against the model
(context length, LoRA's target modules, the memory plan) run once its ``config.json`` is known.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional

import torch

from reasonrl.config import Config, ConfigError
from reasonrl.config.batch_plan import BatchPlan
from reasonrl.config.combinations import combination_problems
from reasonrl.config.passes import Passes, passes_needed
from reasonrl.config.worker_plan import WorkerPlan, engine_sleep_level, weight_sync_bucket_bytes


@dataclass(frozen=True)
class RunPlan:
    """The facts of one run derived from its config (see the module docstring)."""

    device: str
    """``cpu`` or ``cuda`` (``trainer.device``, ``auto`` resolved)."""
    mode: str
    """``colocated`` (the engines live in the actor workers) or ``async`` (rollout workers of their own)."""
    world_size: int
    """Actor (data-parallel) ranks."""
    engine_ranks: int
    """Ranks that share one rollout engine (``rollout.tensor_parallel_size``)."""
    rollout_workers: int
    """Rollout workers of ``async`` mode (0 when colocated)."""
    steps_ahead: int
    """Rounds generated ahead of training (``async_rollout.max_staleness``; 0 when colocated)."""
    batch: BatchPlan
    """Every batch size (checked)."""
    passes: Passes
    """The teacher-forced passes a step runs (old log-probs, reference, values)."""
    generator: str
    """``plain`` (the engine) or ``tools`` (the multi-turn tool loop around it, ``tool.enabled``)."""
    offload: bool
    """Any of actor/ref/critic offload is on."""
    rollout_logprobs: bool
    """Training rollouts carry the engine's log-probs (``rollout.logprobs``; auto: TIS or the weight-sync check)."""
    stream_chunk_prompts: int
    """Prompts per streamed sub-batch (rewards while generating; 0: one generate call)."""
    training_sampling: Dict[str, Any]
    """``SamplingParams`` fields of training rollouts (``rollout.n`` samples at ``rollout.temperature``)."""
    validation_sampling: Dict[str, Any]
    """``SamplingParams`` fields of validation (one sample at ``rollout.val_temperature``, no log-probs)."""
    ray_cpus: int
    """CPUs Ray is started with (the machine's, twice when two groups time-share them)."""
    cpu_groups: int
    """Worker groups that time-share the cores on CPU (actor, critic, rollout): each worker gets the cluster's CPUs
    divided by world size x groups (``controller.cpus_per_worker``, once Ray is up)."""
    gpu_share: float
    """GPU fraction of each actor rank (0.5 when the critic shares it)."""
    engine_sleep_level: int
    """vLLM's sleep level on GPU (``rollout.sleep_level`` resolved, ``worker_plan.engine_sleep_level``)."""
    bucket_bytes: int
    """Bytes per weight-sync bucket (``worker_plan.weight_sync_bucket_bytes``)."""

    @property
    def use_critic(self) -> bool:
        return self.passes.values

    @property
    def is_async(self) -> bool:
        return self.mode == "async"

    def for_workers(self) -> WorkerPlan:
        """What the training workers read from this plan (handed to each with its config)."""
        return WorkerPlan(batch=self.batch, hosts_engine=not self.is_async, tools=self.generator == "tools",
                          engine_sleep_level=self.engine_sleep_level, bucket_bytes=self.bucket_bytes)

    @classmethod
    def build(cls, cfg: Config, device: Optional[str] = None) -> "RunPlan":
        """The plan of ``cfg``; ConfigError naming the keys when a combination is unsupported or the batch sizes do
        not divide (nothing has started yet)."""
        from reasonrl.config.combinations import combination_problems

        problems = combination_problems(cfg)
        if problems:
            raise ConfigError("; ".join(f"config key '{k}': {m}" for k, m in problems))
        device = device or resolve_device(cfg)
        world = world_size_for(cfg, device)
        batch = BatchPlan.from_config(cfg, world)
        try:
            batch.check()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        r, is_async = cfg.rollout, cfg.trainer.mode == "async"
        rollout_workers = cfg.async_rollout.num_rollout_workers if is_async else 0
        if is_async and rollout_workers > 1 and world % rollout_workers:
            raise ConfigError(f"config key 'async_rollout.num_rollout_workers': {rollout_workers} must divide the "
                              f"{world} actor workers (validation pads batches to the actor count)")
        if world % r.tensor_parallel_size:
            raise ConfigError(f"config key 'rollout.tensor_parallel_size': {r.tensor_parallel_size} must divide the "
                              f"{world} actor workers (each engine spans that many ranks)")
        passes = passes_needed(cfg)
        cores = os.cpu_count() or 1
        groups = 1 + int(passes.values) + int(is_async)  # groups sharing the cores on CPU
        logprobs = rollout_logprobs_wanted(cfg)
        return cls(
            device=device, mode=cfg.trainer.mode, world_size=world, engine_ranks=r.tensor_parallel_size,
            rollout_workers=rollout_workers, steps_ahead=cfg.async_rollout.max_staleness if is_async else 0,
            batch=batch, passes=passes, generator="tools" if cfg.tool.enabled else "plain",
            offload=offload_enabled(cfg), rollout_logprobs=logprobs, stream_chunk_prompts=r.stream_chunk_prompts,
            engine_sleep_level=engine_sleep_level(cfg), bucket_bytes=weight_sync_bucket_bytes(cfg),
            training_sampling={"n": r.n, "temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
                               "max_new_tokens": r.max_new_tokens, "logprobs": logprobs},
            validation_sampling={"n": 1, "temperature": r.val_temperature, "top_p": 1.0, "top_k": -1,
                                 "max_new_tokens": r.max_new_tokens, "logprobs": False},
            ray_cpus=cores * (2 if (passes.values or is_async) else 1),
            cpu_groups=groups,
            gpu_share=0.5 if passes.values else 1.0)


def resolve_device(cfg: Config) -> str:
    from reasonrl.config.device_defaults import resolve_device as device_for

    return device_for(cfg.trainer.device)


def world_size_for(cfg: Config, device: str) -> int:
    """Actor workers (data-parallel ranks); with trainer.mode=async the rollout workers' GPUs are not counted."""
    if cfg.trainer.num_workers:
        return cfg.trainer.num_workers
    rollout_gpus = cfg.async_rollout.num_rollout_workers if cfg.trainer.mode == "async" else 0
    return max(1, torch.cuda.device_count() - rollout_gpus) if device == "cuda" else 1


def rollout_logprobs_wanted(cfg: Config) -> bool:
    """Whether training rollouts ask the engine for log-probs (``rollout.logprobs``; None: only when an off-policy
    correction or the weight-sync check uses them)."""
    if cfg.rollout.logprobs is not None:
        return bool(cfg.rollout.logprobs)
    return cfg.algorithm.off_policy.correction != "none" or cfg.rollout.check_weight_sync


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
                      echo=print, host_bytes: Optional[float] = None, ranks_on_host: Optional[int] = None) -> None:
    """The memory plan of this run (``reasonrl.memory``), printed; ConfigError naming the phases that do not fit, the
    numbers and what would make them fit, unless ``trainer.ignore_memory_plan``. ``*.max_tokens_per_micro_batch=auto``
    is resolved first, in ``cfg`` itself (``apply_auto_budgets``); async mode plans a rollout worker's GPU too. With
    ``host_bytes`` the host's memory is planned as well (``plan_host_memory``: offloaded shards, a sleeping engine)
    for ``ranks_on_host`` ranks (default all)."""
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
    if host_bytes is not None and cfg.trainer.mode != "async":
        _check_host_plan(cfg, model_config, host_bytes, world_size, ranks_on_host, echo)
    if plan.fits or cfg.trainer.ignore_memory_plan:
        return
    over = ", ".join([f"{p.name} {p.total / GIB:.1f} GiB" for p in plan.phases if not p.fits] + plan.notes)
    fixes = fit_suggestions(cfg, model_config, device_bytes, placement)
    raise ConfigError(f"the memory plan does not fit the device's {device_bytes / GIB:.1f} GiB: {over}"
                      + (f"; each of these would make it fit: {', '.join(fixes)}" if fixes else
                         "; no single change makes it fit (more GPUs, a smaller model or shorter sequences)")
                      + "; trainer.ignore_memory_plan=true starts anyway")


def _check_host_plan(cfg: Config, model_config: Dict, host_bytes: float, world_size: int,
                     ranks_on_host: Optional[int], echo) -> None:
    """The host half of ``check_memory_plan``: printed when anything is kept on the host; ConfigError when it passes
    Ray's kill threshold, naming the total, the limit and the single changes that bring it under."""
    from reasonrl.memory import GIB
    from reasonrl.memory.host import plan_host_memory, ray_kill_threshold, render_host_plan

    def host(c: Config):
        return plan_host_memory(c, model_config, host_bytes, world_size, ranks_on_host, ray_kill_threshold())

    plan = host(cfg)
    if plan.terms:
        echo(render_host_plan(plan))
    if plan.fits or cfg.trainer.ignore_memory_plan:
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
    raise ConfigError(f"the host memory plan does not fit: {plan.total / GIB:.1f} GiB kept on this host "
                      f"({', '.join(f'{k} {v / GIB:.1f}' for k, v in plan.terms.items())}) passes Ray's kill "
                      f"threshold {plan.threshold:.2f} x {plan.host_bytes / GIB:.1f} = {plan.limit / GIB:.1f} GiB"
                      + (f"; each of these would fit the host (check the GPU plan too): {', '.join(fixes)}" if fixes
                         else "; offload less or use more hosts") + "; trainer.ignore_memory_plan=true starts anyway")
