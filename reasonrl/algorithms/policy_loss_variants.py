"""Policy losses that replace PPO's hard token clip: CISPO, SAPO and GMPO (registered on import).

Notation per valid token t: r_t = pi(y_t) / pi_old(y_t), A_t the advantage, sg() stop-gradient.
  * ``cispo`` (MiniMax-M1, 2025): loss_t = -sg(w_t) * A_t * log pi(y_t) with the IS weight
    w_t = clip(r_t, weight_min, 1 + clip_high). Every token keeps a gradient (sg(w_t) * A_t * grad log pi);
    only the weight is truncated. The paper sets no lower bound: ``weight_min`` defaults to 0, and
    ``clip_low`` is not used.
  * ``sapo`` (Soft Adaptive Policy Optimization, Qwen 2025): loss_t = -f_t(r_t) * A_t with the soft gate
    f(x) = sigmoid(tau (x - 1)) * 4 / tau, tau = tau_pos where A_t > 0 and tau_neg elsewhere. Its gradient
    w.r.t. log pi is 4 s (1 - s) r_t A_t (s = sigmoid(tau (r_t - 1))): exactly the policy gradient at r = 1,
    fading smoothly as r moves away (faster for larger tau). No clip: ``clip_low``/``clip_high`` are not used.
  * ``gmpo`` (Geometric-Mean Policy Optimization, Zhao et al. 2025): the geometric mean of the sequence's
    token ratios, each clipped in log space one-sidedly by the sign of A_t (PPO's trust region):
    l_t = min(log r_t, clip(log r_t, -clip_low, clip_high)) for A_t >= 0, max(...) for A_t < 0;
    G = exp(mean_t l_t) per sequence and loss_t = -A_t * G. With ``seq-mean-token-mean`` and one advantage
    per sequence this is the paper's objective -A * G per sequence; the paper's range is 0.4 / 0.4.

``clip_dual`` is ignored by all three.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .aggregation import masked_fill_zero, masked_mean
from .policy_loss import LOG_RATIO_CLAMP, finish_policy_loss, register_policy_loss


def _token_log_ratio(log_probs: Tensor, old_log_probs: Tensor, mask: Tensor) -> Tensor:
    """log(pi / pi_old) clamped to +-LOG_RATIO_CLAMP, 0 outside the mask."""
    return masked_fill_zero(log_probs - old_log_probs.detach(), mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@register_policy_loss("cispo", options={"weight_min": 0.0})
def cispo_loss(
    *,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    clip_dual: float = 0.0,
    agg_mode: str = "token-mean",
    norm_length: Optional[int] = None,
    is_weights: Optional[Tensor] = None,
    options: Dict[str, float],
) -> Tuple[Tensor, Dict[str, float]]:
    """CISPO: -sg(clip(r, weight_min, 1 + clip_high)) * A * log pi per token (see the module docstring).

    ``clip_frac`` counts the tokens whose weight was truncated.
    """
    weight_min, weight_max = options["weight_min"], 1.0 + clip_high
    if not 0.0 <= weight_min <= weight_max:
        raise ValueError(f"cispo: weight_min must lie in [0, 1 + clip_high = {weight_max}], got {weight_min}")
    log_ratio = _token_log_ratio(log_probs, old_log_probs, mask)
    ratio = torch.exp(log_ratio).detach()
    weight = ratio.clamp(weight_min, weight_max)
    loss_mat = -weight * advantages * masked_fill_zero(log_probs, mask)
    truncated = (ratio > weight_max) | (ratio < weight_min)
    return finish_policy_loss(
        loss_mat, truncated, torch.zeros_like(truncated), log_ratio, mask, agg_mode, norm_length, is_weights
    )


def sapo_gate(ratio: Tensor, advantages: Tensor, tau_pos: float, tau_neg: float) -> Tensor:
    """SAPO's soft gate sigmoid(tau (r - 1)) * 4 / tau, tau by the sign of the advantage (tau_pos for A > 0)."""
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    return torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau


@register_policy_loss("sapo", options={"tau_pos": 1.0, "tau_neg": 1.05})
def sapo_loss(
    *,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    clip_dual: float = 0.0,
    agg_mode: str = "token-mean",
    norm_length: Optional[int] = None,
    is_weights: Optional[Tensor] = None,
    options: Dict[str, float],
) -> Tuple[Tensor, Dict[str, float]]:
    """SAPO: -gate(r) * A per token, no hard clip (see the module docstring).

    ``clip_frac`` is the share of tokens where the gate's slope 4 s (1 - s) has fallen below 0.5 (the gate at
    least halves that token's gradient; for tau = 1 that is |r - 1| > 1.76).
    """
    tau_pos, tau_neg = options["tau_pos"], options["tau_neg"]
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo: tau_pos and tau_neg must be > 0, got {tau_pos} and {tau_neg}")
    log_ratio = _token_log_ratio(log_probs, old_log_probs, mask)
    ratio = torch.exp(log_ratio)
    loss_mat = -sapo_gate(ratio, advantages, tau_pos, tau_neg) * advantages
    with torch.no_grad():
        tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
        s = torch.sigmoid(tau * (ratio - 1.0))
        damped = 4.0 * s * (1.0 - s) < 0.5
    return finish_policy_loss(
        loss_mat, damped, torch.zeros_like(damped), log_ratio, mask, agg_mode, norm_length, is_weights
    )


def gmpo_clipped_log_ratio(log_ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float) -> Tensor:
    """GMPO's per-token log-ratio, clipped one-sidedly in log space: min(l, clip(l, -clip_low, clip_high)) where
    A >= 0 (a large ratio stops helping), max(...) where A < 0 (a small ratio stops helping)."""
    clamped = log_ratio.clamp(-clip_low, clip_high)
    return torch.where(advantages < 0, torch.maximum(log_ratio, clamped), torch.minimum(log_ratio, clamped))


@register_policy_loss("gmpo")
def gmpo_loss(
    *,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    clip_dual: float = 0.0,
    agg_mode: str = "seq-mean-token-mean",
    norm_length: Optional[int] = None,
    is_weights: Optional[Tensor] = None,
) -> Tuple[Tensor, Dict[str, float]]:
    """GMPO: -A_t * exp(mean_t clipped log r_t) per token; ``clip_low``/``clip_high`` bound log r (see the module
    docstring). ``clip_frac`` counts the tokens whose log-ratio was clipped."""
    log_ratio = _token_log_ratio(log_probs, old_log_probs, mask)
    clipped_lr = masked_fill_zero(gmpo_clipped_log_ratio(log_ratio, advantages, clip_low, clip_high), mask)
    geo_mean = torch.exp(masked_mean(clipped_lr, mask, dim=-1))  # [B]
    loss_mat = -advantages * geo_mean[:, None]
    is_clipped = clipped_lr.detach() != log_ratio.detach()
    return finish_policy_loss(
        loss_mat, is_clipped, torch.zeros_like(is_clipped), log_ratio, mask, agg_mode, norm_length, is_weights
    )
