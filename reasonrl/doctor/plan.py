"""``python -m reasonrl.doctor --plan [--device-gib G] [--gpus N] key=value ...``: the memory plan of a training config
(``reasonrl.memory``: each phase's expected peak per GPU, term by term), without loading anything — also on a machine
without a GPU, for a named device size. Exit status 0 when it fits, 1 when a phase does not (with what would make it
fit), 2 for bad input (a config key, a device size, a model whose config.json cannot be read offline)."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from reasonrl.config import ConfigError, load_config


def plan_main(overrides: Sequence[str], device_gib: Optional[float], gpus: Optional[int]) -> int:
    """Print the plan of the config ``overrides`` (GPU defaults: no CPU profile) on ``gpus`` GPUs of ``device_gib``
    GiB (default: this machine's first GPU, and its GPU count)."""
    from reasonrl.memory import GIB, Placement, fit_suggestions, plan_memory, render_plan
    from reasonrl.models.loader import ModelNotFoundError, resolve_model_path
    from reasonrl.trainer.run_plan import model_config_json

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
    world = gpus or cfg.trainer.num_workers or max(1, torch.cuda.device_count())
    try:
        model_config = model_config_json(resolve_model_path(cfg.model.path))
        placement = Placement(world, cfg.rollout.tensor_parallel_size)
        plan = plan_memory(cfg, model_config, device_bytes, placement)
    except (ModelNotFoundError, ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"model {cfg.model.path}, {world} GPU(s) of {device_bytes / GIB:.1f} GiB")
    print(render_plan(plan))
    if plan.fits:
        print("fits")
        return 0
    fixes = fit_suggestions(cfg, model_config, device_bytes, placement)
    print("does not fit; each of these alone would: " + (", ".join(fixes) if fixes else "(none found)"))
    return 1
