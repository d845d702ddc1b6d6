"""Rollout engines: vllm (colocated, in-process) and hf (transformers generate)."""
from __future__ import annotations

import importlib.util

import torch

from reasonrl.config.combinations import engine_for
from reasonrl.config.schema import RolloutConfig
from reasonrl.registry import Registry

from .base import SLEEP_PARTS, Completion, RolloutEngine, SamplingParams

ENGINES = Registry("rollout engine", config_key="rollout.engine")
"""Engine factories by name: ``(cfg, model_path, tokenizer, dtype, device, max_model_len, lora_rank, sleep_level)
-> engine``;
each imports its engine module (vLLM's is heavy) only when called."""


@ENGINES.register("vllm")
def _vllm_engine(cfg, model_path, tokenizer, dtype, device, max_model_len, lora_rank=0, sleep_level=1):
    from .vllm_engine import VLLMRolloutEngine

    return VLLMRolloutEngine(model_path, cfg, dtype, device, max_model_len, sleep_level=sleep_level,
                             lora_rank=lora_rank)


@ENGINES.register("hf")
def _hf_engine(cfg, model_path, tokenizer, dtype, device, max_model_len, lora_rank=0, sleep_level=1):
    from .hf_engine import HFRolloutEngine

    return HFRolloutEngine.from_pretrained(model_path, tokenizer, dtype, device)  # a LoRA model syncs merged


def resolve_engine_name(name: str) -> str:
    """``auto`` picks vllm when it is installed, else hf; any other name must be registered."""
    if name == "auto":
        return engine_for(name, importlib.util.find_spec("vllm") is not None)
    ENGINES[name]  # an unknown name raises UnknownName, naming the known ones
    return name


def make_rollout_engine(cfg: RolloutConfig, model_path: str, tokenizer, dtype: torch.dtype, device: str,
                        max_model_len: int, lora_rank: int = 0, sleep_level: int = 1) -> RolloutEngine:
    """The engine ``cfg.engine`` names; ``lora_rank`` > 0 starts a vLLM engine that takes adapter-only syncs;
    ``sleep_level``: what a vLLM engine's sleep does with its weights on GPU (1 keep a host copy, 2 discard)."""
    return ENGINES.build(resolve_engine_name(cfg.engine), cfg, model_path, tokenizer, dtype, device, max_model_len,
                         lora_rank, sleep_level)


__all__ = ["ENGINES", "SLEEP_PARTS", "Completion", "RolloutEngine", "SamplingParams", "make_rollout_engine",
           "resolve_engine_name"]
