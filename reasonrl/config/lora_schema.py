"""The ``actor.lora`` section: train LoRA adapters (peft) on the actor instead of all its weights (docs/lora.md).
One docstring per field; ``docs/configuration.md`` is generated from these with ``schema.py``
(``python -m reasonrl.config.docs``). ``validate_lora`` holds the section's rules; ``load.validate`` calls it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class LoraConfig:
    """LoRA on the actor (peft): adapters on the decoder layers' linear projections; see docs/lora.md."""

    rank: int = 0
    """LoRA rank r of every adapted projection (0: off, the whole actor trains). With LoRA on, the optimizer holds
    only the adapters, the reference policy is the actor's own model with its adapters disabled (no second copy),
    and a weight sync sends the adapters only (``merge_for_rollout``)."""
    alpha: float = 32.0
    """LoRA scaling numerator: the adapter's update B A is scaled by ``alpha / rank``."""
    dropout: float = 0.0
    """Dropout on the adapters' input during the update (0 <= dropout < 1). Above 0 the update's forward is not the
    old-log-prob pass's (dropout is off in eval), so the PPO ratio starts away from 1; 0 is the usual choice for RL."""
    target_modules: List[str] = field(default_factory=list)
    """Names (the last part, e.g. ``q_proj``) of the linear projections that get adapters. Empty: every linear
    projection inside the decoder layers of the loaded architecture (attention and MLP), found from the model. A
    name the model does not have fails before anything starts (the model is built on the meta device from its
    config.json, no weights read), listing the candidates. Set with ``rank`` 0 it is refused (it would train the
    whole actor)."""
    merge_for_rollout: bool = False
    """How a sync reaches the rollout engine. false: the adapter only (the hf engine applies it on its own copy of
    the base model; vLLM loads it as a LoRA adapter, one ``LoRARequest`` per sync). true: the adapter is merged into
    the base weights (W + alpha/r B A) and the full merged weights are synced as without LoRA (for engines or
    settings without adapter support)."""


def validate_lora(cfg, need) -> None:
    """The section's rules (``need(ok, key, message)`` raises the ConfigError naming the key)."""
    lora = cfg.actor.lora
    need(lora.rank >= 0, "actor.lora.rank", f"must be >= 0 (0: LoRA off), got {lora.rank}")
    need(lora.alpha > 0, "actor.lora.alpha", f"must be > 0, got {lora.alpha}")
    need(0 <= lora.dropout < 1, "actor.lora.dropout", f"must be in [0, 1), got {lora.dropout}")
    names = list(lora.target_modules)
    need(all(isinstance(n, str) and n and "." not in n for n in names), "actor.lora.target_modules",
         f"must be module names without dots (e.g. [q_proj,v_proj]), got {names}")
    need(len(set(names)) == len(names), "actor.lora.target_modules", f"names a module twice: {names}")
    need(lora.rank > 0 or not names, "actor.lora.rank", f"is 0 (LoRA off: the whole actor would train), but "
         f"actor.lora.target_modules={names} asks for adapters: set actor.lora.rank > 0, or drop "
         f"actor.lora.target_modules for a full fine-tune")
    # LoRA's rules with other features (compile, tensor-parallel rollouts) are in config/combinations.py
