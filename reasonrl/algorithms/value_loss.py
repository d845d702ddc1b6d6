"""Critic loss (clipped value loss, as in PPO implementations since OpenAI baselines) and explained variance."""

from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import Tensor

from .aggregation import aggregate_loss, check_same_shape, masked_mean, masked_var


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    cliprange: float,
    agg_mode: str = "token-mean",
) -> Tuple[Tensor, Dict[str, float]]:
    """0.5 * max((V - R)^2, (V_clip - R)^2) with V_clip = V_old + clamp(V - V_old, -cliprange, cliprange).

    Returns (scalar loss, metrics) with ``critic/vf_clip_frac`` (share of valid tokens where the clipped
    error is the larger one, i.e. the gradient is cut) and ``critic/vpred_mean``.
    """
    check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    old_values = old_values.detach()
    clipped_values = old_values + (values - old_values).clamp(-cliprange, cliprange)
    unclipped_err = (values - returns) ** 2
    clipped_err = (clipped_values - returns) ** 2
    loss_mat = 0.5 * torch.maximum(unclipped_err, clipped_err)
    loss = aggregate_loss(loss_mat, mask, agg_mode)
    with torch.no_grad():
        metrics = {
            "critic/vf_clip_frac": masked_mean((clipped_err > unclipped_err).float(), mask).item(),
            "critic/vpred_mean": masked_mean(values.float(), mask).item(),
        }
    return loss, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var[R - V] / Var[R] over valid tokens: 1 is a perfect critic, 0 no better than a constant.

    Returns 0.0 when the returns have no variance (the ratio is undefined).
    """
    check_same_shape(values=values, returns=returns, mask=mask)
    with torch.no_grad():
        var_returns = masked_var(returns.float(), mask)
        if var_returns.item() <= 1e-12:
            return 0.0
        return (1.0 - masked_var((returns - values).float(), mask) / var_returns).item()
