"""Importance weights between the policy that sampled a batch (the behaviour policy: the rollout engine's log-probs)
and the trainer's proximal policy (its log-probs of the batch at the start of the update, ``old_log_probs``).

The engine (vLLM, bf16 kernels) and the FSDP trainer give slightly different probabilities for the same weights, and
in async mode the engine's weights are up to ``async_rollout.max_staleness`` updates old, so the sampled tokens come
from pi_behav, not pi_prox. The importance weight w = pi_prox / pi_behav corrects for it:

* level ``token``: w_t = exp(prox_t - behav_t) per valid token;
* level ``sequence``: w = exp(sum over valid t of (prox_t - behav_t)) = prod_t w_t, the same on every valid token of
  the sequence.

Two ways to bound w (``algorithm.off_policy.correction``):

* truncated IS (``tis_weights``): min(w, cap), every token stays in the loss;
* masked IS (``mis_weights``): w where lower <= w <= upper; a token (level token) or a whole sequence (level sequence)
  outside that interval leaves the loss (``kept`` is False there; the actor drops it from the loss mask, so it counts
  in neither the numerator nor the denominator of the aggregation).

The decoupled PPO objective (``decoupled_ppo``) applies the truncated token weight to PPO's clipped surrogate.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .aggregation import check_same_shape, masked_fill_zero, masked_mean, masked_sum

IS_LEVELS = ("token", "sequence")
"""Where one importance weight applies: each token, or each whole sequence (the product of its token ratios)."""
CORRECTIONS = ("none", "tis", "mis", "decoupled")
"""The off-policy corrections of the loss (``algorithm.off_policy.correction``)."""
WEIGHT_LOG_CLAMP = 20.0
"""|log w| is clamped to this before exp where w itself is kept (masked IS, statistics): exp(20) ~ 4.9e8."""


def log_is_ratio(prox_log_probs: Tensor, behav_log_probs: Tensor, mask: Tensor, level: str) -> Tensor:
    """log w [B, T] (no gradient, 0 outside the mask): prox_t - behav_t (``token``), or the sequence's sum of those
    over its valid tokens on every valid token (``sequence``)."""
    check_same_shape(prox_log_probs=prox_log_probs, behav_log_probs=behav_log_probs, mask=mask)
    if level not in IS_LEVELS:
        raise ValueError(f"unknown importance-sampling level {level!r}; choose one of {IS_LEVELS}")
    with torch.no_grad():
        log_w = masked_fill_zero(prox_log_probs.float() - behav_log_probs.float(), mask)
        if level == "sequence":
            log_w = masked_sum(log_w, mask, dim=-1)[:, None].expand_as(log_w)
        return masked_fill_zero(log_w, mask)


def tis_weights(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, mode: str, cap: float) -> Tensor:
    """Truncated importance weights min(w, cap) [B, T], 0 outside the mask, no gradient; ``mode`` is the level
    (token or sequence). ``cap`` may be ``inf`` (no truncation)."""
    if not cap > 0:
        raise ValueError(f"TIS cap must be positive, got {cap}")
    log_w = log_is_ratio(old_log_probs, rollout_log_probs, mask, mode)
    # exp(min(x, log cap)) == min(exp(x), cap), and can never overflow.
    return masked_fill_zero(torch.exp(log_w.clamp(max=math.log(cap))), mask)


def mis_weights(prox_log_probs: Tensor, behav_log_probs: Tensor, mask: Tensor, level: str, lower: float,
                upper: float) -> Tuple[Tensor, Tensor]:
    """Masked importance sampling: (weights [B, T], kept [B, T] bool). ``kept``: valid positions whose w (the token's,
    or its sequence's) lies in [lower, upper]; ``weights``: w there, 0 elsewhere. No gradient."""
    if not 0 <= lower <= upper:
        raise ValueError(f"masked IS needs 0 <= lower <= upper, got lower={lower}, upper={upper}")
    log_w = log_is_ratio(prox_log_probs, behav_log_probs, mask, level)
    w = torch.exp(log_w.clamp(-WEIGHT_LOG_CLAMP, WEIGHT_LOG_CLAMP))
    kept = mask.bool() & (w >= lower) & (w <= upper)
    return masked_fill_zero(w, kept), kept


def correction_weights(correction: str, prox_log_probs: Tensor, behav_log_probs: Tensor, mask: Tensor, *,
                       level: str = "token", cap: float = math.inf, lower: float = 0.0,
                       upper: float = math.inf) -> Optional[Tensor]:
    """The importance weights [B, T] a policy loss multiplies by under ``correction``: None for none (and for
    decoupled, whose objective builds its own, ``decoupled_ppo``); tis: ``tis_weights``; mis: ``mis_weights``'
    weights (``mask`` should already leave out what mis rejects: the actor takes ``kept`` as its loss mask)."""
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown off-policy correction {correction!r}; choose one of {CORRECTIONS}")
    if correction == "tis":
        return tis_weights(prox_log_probs, behav_log_probs, mask, level, cap)
    if correction == "mis":
        return mis_weights(prox_log_probs, behav_log_probs, mask, level, lower, upper)[0]
    return None


def logprob_mismatch_stats(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor) -> Dict[str, float]:
    """Mean and max of |old - rollout| log-prob over valid tokens (0.0 when there are none)."""
    check_same_shape(old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs, mask=mask)
    with torch.no_grad():
        diff = masked_fill_zero((old_log_probs.float() - rollout_log_probs.float()).abs(), mask)
        return {
            "rollout/logprob_diff_mean": masked_mean(diff, mask).item(),
            "rollout/logprob_diff_max": diff.max().item() if diff.numel() else 0.0,
        }
