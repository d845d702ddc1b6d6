"""Settings whose default depends on the device the run trains on, resolved in one place by the plan.

``device_settings(cfg, device, varlen_importable)`` returns one row per device-dependent setting: its effective value
(the settings left at None or ``auto`` resolved) and why; the start-up table prints them, and the plan
(``RunPlan.device_settings``) hands the resolved values to the workers (``RunPlan.run_config``). Nothing is written
into the config. Pure: no torch (the machine's facts come in as a ``Hardware``, ``reasonrl.hardware``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, List, Optional


@dataclass(frozen=True)
class Hardware:
    """The machine a plan is made for (``reasonrl.hardware.local_hardware`` asks torch; tests and the doctor name
    one)."""

    device: str = "cpu"
    """``cpu`` or ``cuda`` (``trainer.device`` resolved)."""
    gpu_count: int = 0
    """GPUs torch sees on this host (0 on CPU)."""
    varlen_attention: bool = False
    """This torch has the varlen attention kernel (``model.attn_implementation=auto`` picks it on a GPU)."""
    vllm_installed: Optional[bool] = None
    """vLLM is importable here (``rollout.engine=auto`` picks it); None: not asked (``auto`` is resolved where the
    engine starts)."""
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)
    """This host's cores (Ray is started with them)."""


RESOLVED_KEYS = ("rollout.enforce_eager", "model.attn_implementation", "actor.use_packing",
                 "rollout.gpu_memory_utilization")
"""The settings whose None/``auto`` the plan resolves (``RunPlan.run_config`` fills them for the workers; vLLM's GPU
share is ``async_rollout.engine_memory_fraction`` with ``async_rollout.share_devices``)."""


@dataclass(frozen=True)
class DeviceSetting:
    """One row of the start-up table's per-device section."""

    key: str
    """The config key, e.g. ``rollout.enforce_eager``."""
    value: Any
    """The value the run uses."""
    why: str
    """Where the value comes from (your setting, or the device's default and what the other device would get)."""


def enforce_eager_for(value: Optional[bool], device: str) -> bool:
    """``rollout.enforce_eager`` as used: the user's value, else eager on CPU (vLLM's CPU backend gains little from
    graphs and starts faster without) and CUDA graphs on GPU (2.8x faster decoding, measured on an H200)."""
    if value is not None:
        return bool(value)
    return not str(device).startswith("cuda")


VARLEN_ATTENTION = "varlen"
"""``model.attn_implementation`` of torch's variable-length attention kernel (reasonrl.models.varlen_attention)."""
PACKED_ATTENTION = (VARLEN_ATTENTION, "flash_attention_2", "flash_attention_3", "flash_attention_4")
"""Attention implementations that run a packed row's sequences through variable-length kernels: no dense mask, no
compute between sequences. ``actor.use_packing`` is on by default with them."""


def attn_implementation_for(value: str, device: str, varlen_importable: bool) -> str:
    """``model.attn_implementation`` as used: the user's value, else (``auto``) the varlen kernel on a GPU whose torch
    has it (no flash-attn package needed; docs/performance.md) and sdpa elsewhere (the CPU has no varlen kernel)."""
    if value != "auto":
        return value
    return VARLEN_ATTENTION if str(device).startswith("cuda") and varlen_importable else "sdpa"


def use_packing_for(value: Optional[bool], attn_implementation: str) -> bool:
    """``actor.use_packing`` as used: the user's value, else on exactly when the attention implementation runs the
    packed row through variable-length kernels (``PACKED_ATTENTION``); sdpa and eager would compute a dense mask over
    the whole packed row."""
    if value is not None:
        return bool(value)
    return attn_implementation in PACKED_ATTENTION


def device_settings(cfg: Any, device: str, varlen_importable: bool = False) -> List[DeviceSetting]:
    """The effective value of each per-device setting of ``cfg`` on ``device`` ("cpu" or "cuda") with its reason
    (``cfg`` is read, never written)."""
    on_gpu = str(device).startswith("cuda")
    rows: List[DeviceSetting] = []
    r = cfg.rollout
    enforce_eager = enforce_eager_for(r.enforce_eager, device)
    if r.enforce_eager is None:
        why = "GPU default; CPU would be true" if on_gpu else "CPU default; GPU would be false (CUDA graphs)"
    else:
        why = "set by you"
    rows.append(DeviceSetting("rollout.enforce_eager", enforce_eager, why))
    if on_gpu and cfg.trainer.mode == "async" and cfg.async_rollout.share_devices:
        rows.append(DeviceSetting("rollout.gpu_memory_utilization", cfg.async_rollout.engine_memory_fraction,
                                  "async_rollout.engine_memory_fraction: each replica's share of the GPU it shares "
                                  "with an actor rank (awake while it trains); the rest is the trainer's"))
    elif on_gpu:
        rows.append(DeviceSetting("rollout.gpu_memory_utilization", r.gpu_memory_utilization,
                                  "vLLM's share of each GPU; 0.5 fits a 1.5B actor + ref + vLLM on 80 GB"))
        rows.append(DeviceSetting("rollout.free_cache_engine", r.free_cache_engine,
                                  "vLLM sleeps while the actor trains" if r.free_cache_engine
                                  else "vLLM keeps its memory while the actor trains"))
    else:
        rows.append(DeviceSetting("rollout.kv_cache_gb", r.kv_cache_gb, "vLLM's KV cache in host memory (CPU)"))
    m, a = cfg.model, cfg.actor
    attn = attn_implementation_for(m.attn_implementation, device, varlen_importable)
    if m.attn_implementation == "auto":
        why = "auto: the varlen kernel on a GPU with torch's varlen_attn, sdpa otherwise"
    else:
        why = "set by you"
    rows.append(DeviceSetting("model.attn_implementation", attn, why))
    if a.use_packing is None:
        why = f"auto: on with variable-length attention ({', '.join(PACKED_ATTENTION)}), off otherwise"
    else:
        why = "set by you"
    rows.append(DeviceSetting("actor.use_packing", use_packing_for(a.use_packing, attn), why))
    micro = cfg.actor.micro_batch_size_per_worker
    default_micro = type(cfg.actor)().micro_batch_size_per_worker
    if micro != default_micro:
        why = "set by you or the CPU profile"
    elif on_gpu:
        why = "default, sized for a 1.5B model on one 80 GB GPU; lower it if the update runs out of memory"
    else:
        why = "default"
    rows.append(DeviceSetting("actor.micro_batch_size_per_worker", micro, why))
    return rows
