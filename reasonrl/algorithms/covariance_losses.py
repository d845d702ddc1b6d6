"""Clip-Cov and KL-Cov (Cui et al., 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models"), registered on import.

Policy entropy falls fastest through the few tokens whose log-prob and advantage covary most. Each valid
token's share of that covariance, over the valid tokens the loss sees (one micro-batch)::

    cov_t = (log pi(y_t) - mean log pi) * (A_t - mean A)        (log-probs detached)

  * ``clip_cov``: the PPO clip surrogate (``clipped_surrogate``, dual clip included); of the tokens the clip
    left alone whose cov_t lies strictly between ``clip_cov_lb`` and ``clip_cov_ub``, a random
    max(1, int(clip_cov_ratio * valid tokens)) have their loss detached (value kept, no gradient). The choice
    uses torch's global random generator.
  * ``kl_cov``: no clip; the max(1, int(kl_cov_ratio * valid tokens)) tokens with the largest cov_t get
    loss_t = -A_t r_t + kl_cov_coef * |log r_t|, every other token -A_t r_t (r_t = pi / pi_old).

Defaults: ratios 2e-4, bounds (1, 5) as in the paper's code; kl_cov_coef 1 as in its KL-Cov scripts.
Metric ``actor/cov_selected_frac``: the share of valid tokens detached (clip_cov) or penalised (kl_cov).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .aggregation import masked_fill_zero, masked_mean
from .policy_loss import LOG_RATIO_CLAMP, clipped_surrogate, finish_policy_loss, register_policy_loss


def token_covariance(log_probs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """cov_t = (lp_t - mean lp) * (A_t - mean A), means over valid tokens; 0 outside the mask, no gradient."""
    with torch.no_grad():
        lp = log_probs.detach().float()
        adv = advantages.detach().float()
        cov = (lp - masked_mean(lp, mask)) * (adv - masked_mean(adv, mask))
        return masked_fill_zero(cov, mask)


def _selection_size(mask: Tensor, ratio: float) -> int:
    """max(1, int(ratio * valid tokens)); 0 without valid tokens or with ratio 0 (the selection is off)."""
    n_valid = int(mask.bool().sum())
    return max(1, int(ratio * n_valid)) if n_valid and ratio > 0 else 0


def _check_ratio(loss: str, key: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{loss}: {key} must lie in [0, 1], got {value}")


@register_policy_loss("clip_cov", options={"clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0})
def clip_cov_loss(
    *,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    clip_dual: float = 3.0,
    agg_mode: str = "token-mean",
    norm_length: Optional[int] = None,
    is_weights: Optional[Tensor] = None,
    options: Dict[str, float],
) -> Tuple[Tensor, Dict[str, float]]:
    """Clip-Cov: PPO clip, plus a random few high-covariance tokens detached (see the module docstring)."""
    ratio_opt, lb, ub = options["clip_cov_ratio"], options["clip_cov_lb"], options["clip_cov_ub"]
    _check_ratio("clip_cov", "clip_cov_ratio", ratio_opt)
    if not lb < ub:
        raise ValueError(f"clip_cov: clip_cov_lb ({lb}) must be below clip_cov_ub ({ub})")
    log_ratio = masked_fill_zero(log_probs - old_log_probs.detach(), mask)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss_mat, is_clipped, is_dual = clipped_surrogate(ratio, advantages, clip_low, clip_high, clip_dual)
    cov = token_covariance(log_probs, advantages, mask)
    candidates = mask.bool() & ~is_clipped & ~is_dual & (cov > lb) & (cov < ub)
    selected = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)
    cand_idx = candidates.flatten().nonzero().squeeze(-1)
    n_pick = min(_selection_size(mask, ratio_opt), cand_idx.numel())
    if n_pick > 0:
        chosen = cand_idx[torch.randperm(cand_idx.numel(), device=cand_idx.device)[:n_pick]]
        selected.view(-1)[chosen] = True
    loss_mat = torch.where(selected, loss_mat.detach(), loss_mat)
    loss, metrics = finish_policy_loss(
        loss_mat, is_clipped, is_dual, log_ratio, mask, agg_mode, norm_length, is_weights
    )
    metrics["actor/cov_selected_frac"] = masked_mean(selected.float(), mask).item()
    return loss, metrics


@register_policy_loss("kl_cov", options={"kl_cov_ratio": 0.0002, "kl_cov_coef": 1.0})
def kl_cov_loss(
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
    """KL-Cov: -A r everywhere, plus kl_cov_coef * |log r| on the top-covariance tokens (see the module
    docstring). No clip: ``clip_low``/``clip_high``/``clip_dual`` are not used."""
    ratio_opt, coef = options["kl_cov_ratio"], options["kl_cov_coef"]
    _check_ratio("kl_cov", "kl_cov_ratio", ratio_opt)
    if coef < 0:
        raise ValueError(f"kl_cov: kl_cov_coef must be >= 0, got {coef}")
    log_ratio = masked_fill_zero(log_probs - old_log_probs.detach(), mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_mat = -advantages * ratio
    cov = token_covariance(log_probs, advantages, mask)
    selected = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)
    n_pick = _selection_size(mask, ratio_opt)
    if n_pick > 0:
        ranked = torch.where(mask.bool(), cov, torch.full_like(cov, -torch.inf)).flatten()
        selected.view(-1)[torch.topk(ranked, n_pick).indices] = True
    loss_mat = torch.where(selected, loss_mat + coef * log_ratio.abs(), loss_mat)
    no_clip = torch.zeros_like(selected)
    loss, metrics = finish_policy_loss(loss_mat, no_clip, no_clip, log_ratio, mask, agg_mode, norm_length, is_weights)
    metrics["actor/cov_selected_frac"] = masked_mean(selected.float(), mask).item()
    return loss, metrics
