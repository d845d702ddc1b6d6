"""Truncated importance sampling (TIS) between the rollout engine and the trainer's policy.

The rollout engine (vLLM, bf16 kernels) and the FSDP trainer compute slightly different
probabilities for the same weights, so the sampled tokens come from pi_rollout, not pi_old. Weighting
the loss by w = pi_old / pi_rollout, truncated at ``cap`` to bound the variance, corrects for it.
"""

from __future__ import annotations

import math
from typing import Dict

import torch
from torch import Tensor

from .aggregation import check_same_shape, masked_fill_zero, masked_mean, masked_sum

TIS_MODES = ("token", "sequence")


def tis_weights(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, mode: str, cap: float) -> Tensor:
    """Truncated importance weights [B, T], 0 outside the mask, no gradient.

    * ``token``: w_t = min(exp(old_t - rollout_t), cap).
    * ``sequence``: w = min(exp(sum over valid t of (old_t - rollout_t)), cap) = min(prod_t ratio_t, cap)
      on every valid token of the sequence.
    """
    check_same_shape(old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs, mask=mask)
    if mode not in TIS_MODES:
        raise ValueError(f"unknown TIS mode {mode!r}; choose one of {TIS_MODES}")
    if cap <= 0:
        raise ValueError(f"TIS cap must be positive, got {cap}")
    with torch.no_grad():
        log_ratio = masked_fill_zero(old_log_probs.float() - rollout_log_probs.float(), mask)
        if mode == "sequence":
            log_ratio = masked_sum(log_ratio, mask, dim=-1)[:, None].expand_as(log_ratio)
        # exp(min(x, log cap)) == min(exp(x), cap), and can never overflow.
        weights = torch.exp(log_ratio.clamp(max=math.log(cap)))
        return masked_fill_zero(weights, mask)


def logprob_mismatch_stats(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor) -> Dict[str, float]:
    """Mean and max of |old - rollout| log-prob over valid tokens (0.0 when there are none)."""
    check_same_shape(old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs, mask=mask)
    with torch.no_grad():
        diff = masked_fill_zero((old_log_probs.float() - rollout_log_probs.float()).abs(), mask)
        return {
            "rollout/logprob_diff_mean": masked_mean(diff, mask).item(),
            "rollout/logprob_diff_max": diff.max().item() if diff.numel() else 0.0,
        }
