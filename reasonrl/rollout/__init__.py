"""Rollout engines: vllm (colocated, in-process) and hf (transformers generate)."""
from __future__ import annotations

import importlib.util

import torch

from reasonrl.config.schema import RolloutConfig

from .base import SLEEP_PARTS, Completion, RolloutEngine, SamplingParams


def resolve_engine_name(name: str) -> str:
    """``auto`` picks vllm when it is installed, else hf."""
    if name == "auto":
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if name not in ("vllm", "hf"):
        raise ValueError(f"rollout.engine must be auto, vllm or hf, not {name!r}")
    return name


def make_rollout_engine(cfg: RolloutConfig, model_path: str, tokenizer, dtype: torch.dtype, device: str,
                        max_model_len: int) -> RolloutEngine:
    name = resolve_engine_name(cfg.engine)
    if name == "vllm":
        from .vllm_engine import VLLMRolloutEngine

        return VLLMRolloutEngine(model_path, cfg, dtype, device, max_model_len)
    from .hf_engine import HFRolloutEngine

    return HFRolloutEngine.from_pretrained(model_path, tokenizer, dtype, device)


__all__ = ["SLEEP_PARTS", "Completion", "RolloutEngine", "SamplingParams", "make_rollout_engine", "resolve_engine_name"]
