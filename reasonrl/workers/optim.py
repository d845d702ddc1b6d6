"""``build_adamw``: the AdamW of a trained model (the actor, the critic) with the implementation ``actor.adamw_impl``
resolves to (``reasonrl.config.worker_plan.adamw_impl``)."""
from __future__ import annotations

from typing import Iterable

import torch

from reasonrl.config.worker_plan import adamw_impl


def adamw_flags(impl: str) -> dict:
    """torch.optim.AdamW's keyword arguments for a resolved implementation (fused, foreach or for_loop)."""
    return {"fused": {"fused": True, "foreach": False}, "foreach": {"foreach": True, "fused": False},
            "for_loop": {"foreach": False, "fused": False}}[impl]


def build_adamw(params: Iterable[torch.nn.Parameter], cfg, lr: float, device: str) -> torch.optim.AdamW:
    """AdamW over ``params`` at ``lr`` with the actor's betas and weight decay, run as ``actor.adamw_impl`` says for
    ``device`` (the device the step runs on: an offloaded state comes back to it for the update)."""
    a = cfg.actor
    impl = adamw_impl(cfg, torch.device(device).type)
    return torch.optim.AdamW(list(params), lr=lr, betas=tuple(a.betas), weight_decay=a.weight_decay,
                             **adamw_flags(impl))
