"""Settings whose default depends on the device the run trains on, resolved in one place after the config loads.

``apply_device_defaults(cfg, device)`` fills the settings left at None or ``auto`` and returns one row per
device-dependent setting: its effective value and why (the start-up table prints them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional


@dataclass
class DeviceSetting:
    """One row of the start-up table's per-device section."""

    key: str
    """The config key, e.g. ``rollout.enforce_eager``."""
    value: Any
    """The value the run uses."""
    why: str
    """Where the value comes from (your setting, or the device's default and what the other device would get)."""


def resolve_device(trainer_device: str) -> str:
    """The device a process computes on: ``trainer.device`` when it names one, else cuda when torch sees a GPU
    (``auto``). The one rule every process applies: the controller (RunPlan), eval and the workers."""
    if trainer_device != "auto":
        return trainer_device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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


def varlen_kernel_importable() -> bool:
    """Whether this torch has ``torch.nn.attention.varlen.varlen_attn`` (2.11 on; its kernel is CUDA-only)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


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


def apply_device_defaults(cfg: Any, device: str) -> List[DeviceSetting]:
    """Fill the per-device settings left at None or ``auto`` in ``cfg`` (in place) for ``device`` ("cpu" or "cuda"), and
    return the effective value of each per-device setting with its reason."""
    on_gpu = str(device).startswith("cuda")
    rows: List[DeviceSetting] = []
    r = cfg.rollout
    if r.enforce_eager is None:
        r.enforce_eager = enforce_eager_for(None, device)
        why = "GPU default; CPU would be true" if on_gpu else "CPU default; GPU would be false (CUDA graphs)"
    else:
        why = "set by you"
    rows.append(DeviceSetting("rollout.enforce_eager", r.enforce_eager, why))
    if on_gpu:
        rows.append(DeviceSetting("rollout.gpu_memory_utilization", r.gpu_memory_utilization,
                                  "vLLM's share of each GPU; 0.5 fits a 1.5B actor + ref + vLLM on 80 GB"))
        rows.append(DeviceSetting("rollout.free_cache_engine", r.free_cache_engine,
                                  "vLLM sleeps while the actor trains" if r.free_cache_engine
                                  else "vLLM keeps its memory while the actor trains"))
    else:
        rows.append(DeviceSetting("rollout.kv_cache_gb", r.kv_cache_gb, "vLLM's KV cache in host memory (CPU)"))
    m, a = cfg.model, cfg.actor
    if m.attn_implementation == "auto":
        m.attn_implementation = attn_implementation_for("auto", device, varlen_kernel_importable())
        why = "auto: the varlen kernel on a GPU with torch's varlen_attn, sdpa otherwise"
    else:
        why = "set by you"
    rows.append(DeviceSetting("model.attn_implementation", m.attn_implementation, why))
    if a.use_packing is None:
        a.use_packing = use_packing_for(None, m.attn_implementation)
        why = f"auto: on with variable-length attention ({', '.join(PACKED_ATTENTION)}), off otherwise"
    else:
        why = "set by you"
    rows.append(DeviceSetting("actor.use_packing", a.use_packing, why))
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
