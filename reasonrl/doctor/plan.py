"""``python -m reasonrl.doctor --plan [--device-gib G] [--gpus N] key=value ...``: the memory plan of a training config
(``reasonrl.memory``: each phase's expected peak per GPU, term by term), without loading anything — also on a machine
without a GPU, for a named device size. Exit status 0 when it fits, 1 when a phase does not (with what would make it
fit), 2 for bad input (a config key, a device size, a model whose config.json cannot be read offline). Token
budgets set to ``auto`` are resolved first and printed; async mode adds a rollout worker's GPU (with
``async_rollout.share_devices`` the replica's engine is in the one GPU plan instead)."""
from __future__ import annotations

import sys
from dataclasses import replace
from typing import Optional, Sequence

from reasonrl.config import ConfigError, load_config


def plan_main(overrides: Sequence[str], device_gib: Optional[float], gpus: Optional[int],
              host_gib: Optional[float] = None) -> int:
    """Print the plan of the config ``overrides`` (GPU defaults: no CPU profile) on ``gpus`` GPUs of ``device_gib``
    GiB (default: this machine's first GPU, and its GPU count), and the host plan (``plan_host_memory``) of all the
    GPUs on one host of ``host_gib`` GiB (default: this machine)."""
    from reasonrl.config.device_defaults import Hardware
    from reasonrl.config.model_facts import ModelFacts
    from reasonrl.config.plan import RunPlan
    from reasonrl.hardware import varlen_kernel_importable
    from reasonrl.memory import (GIB, AutoBudgetError, describe_budgets, fit_suggestions, plan_memory,
                                 plan_rollout_worker, render_plan, resolve_auto_budgets)
    from reasonrl.memory.auto import host_memory_bytes
    from reasonrl.memory.host import plan_host_memory, ray_kill_threshold, render_host_plan
    from reasonrl.models.loader import ModelNotFoundError, resolve_model_path

    try:
        cfg, _ = load_config(list(overrides), cuda_available=True)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    if device_gib is None:
        if not torch.cuda.is_available():
            print("error: no GPU here: name the device size, e.g. --device-gib 80", file=sys.stderr)
            return 2
        device_bytes = float(torch.cuda.get_device_properties(0).total_memory)
    elif not device_gib > 0:
        print(f"error: --device-gib must be a positive number of GiB, got {device_gib}", file=sys.stderr)
        return 2
    else:
        device_bytes = device_gib * GIB
    if host_gib is not None and not host_gib > 0:
        print(f"error: --host-gib must be a positive number of GiB, got {host_gib}", file=sys.stderr)
        return 2
    world = gpus or cfg.trainer.num_workers or max(1, torch.cuda.device_count())
    print(f"model {cfg.model.path}, {world} GPU(s) of {device_bytes / GIB:.1f} GiB")
    try:
        facts = ModelFacts.read(resolve_model_path(cfg.model.path), cfg.model.path)
        model_config = facts.require_config()
        # the plan of a GPU run of this torch on ``world`` GPUs: its attention, packing and (auto) token budgets
        on_gpus = replace(cfg, trainer=replace(cfg.trainer, num_workers=world))
        run = RunPlan.build(on_gpus, Hardware("cuda", world, varlen_kernel_importable())).with_model(facts)
        budgets = resolve_auto_budgets(run.run_config(cfg), model_config, device_bytes, run)
        if budgets:
            print(describe_budgets(budgets, device_bytes))
        run = run.with_model(facts, budgets)
        cfg = run.run_config(cfg)
        plan = plan_memory(cfg, model_config, device_bytes, run)
        host = plan_host_memory(cfg, model_config, host_gib * GIB if host_gib else host_memory_bytes(), world,
                                threshold=ray_kill_threshold()) if cfg.trainer.mode != "async" else None
        separate = run.is_async and not run.share_devices  # shared: the replica's engine is in the GPU's plan
        rollout = plan_rollout_worker(cfg, model_config, device_bytes, run) if separate else None
    except AutoBudgetError as exc:
        print(f"does not fit: {exc}")
        return 1
    except (ModelNotFoundError, ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render_plan(plan))
    if host is not None and host.terms:
        print(render_host_plan(host))
    if rollout is not None:
        print(f"each of the {cfg.async_rollout.num_rollout_workers} rollout worker GPU(s) (trainer.mode=async): "
              + render_plan(rollout))
    if rollout is not None and not rollout.fits:
        print("does not fit: a rollout worker's GPU (its engine alone: a lower rollout.gpu_memory_utilization or "
              "shorter sequences)")
        return 1
    if host is not None and not host.fits:
        print(f"does not fit: the host ({host.total / GIB:.1f} GiB kept there, Ray kills a worker past "
              f"{host.limit / GIB:.1f}): offload less, ref.param_dtype=auto or rollout.sleep_level=2")
        return 1
    if plan.fits:
        print("fits")
        return 0
    fixes = fit_suggestions(cfg, model_config, device_bytes, run)
    print("does not fit; each of these alone would: " + (", ".join(fixes) if fixes else "(none found)"))
    return 1
