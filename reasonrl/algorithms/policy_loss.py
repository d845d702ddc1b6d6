"""Policy-gradient losses, selected by name: ``policy_loss("ppo_clip", log_probs=..., ...)``.

The registry (``POLICY_LOSSES``) also holds each loss's extra hyper-parameters with their defaults
(``POLICY_LOSS_OPTIONS``; ``algorithm.policy_loss_options``). The losses of this module take none; CISPO,
SAPO and GMPO live in ``policy_loss_variants``, Clip-Cov and KL-Cov in ``covariance_losses``.

These two losses minimise the clipped surrogate  max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
per token and aggregate it with ``aggregate_loss``:
  * ``ppo_clip``: token-level ratio pi/pi_old, asymmetric clip range (DAPO clip-higher) and, for negative
    advantages, the dual clip that bounds the loss by -A * clip_dual (Ye et al., 2020).
  * ``gspo``: one sequence-level ratio exp(mean_t log(pi/pi_old)) per response (GSPO, Zheng et al., 2025),
    broadcast to its tokens. GSPO's clip range is far narrower than PPO's (the paper uses about 3e-4 /
    4e-4): pass it as ``clip_low`` / ``clip_high``. No dual clip.

Metrics (floats): ``actor/clip_frac`` (share of valid tokens whose loss is the clipped branch),
``actor/ppo_kl`` (mean over valid tokens of log pi_old - log pi), ``actor/dual_clip_frac``.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from reasonrl.registry import Registry

from .aggregation import aggregate_loss, check_same_shape, masked_fill_zero, masked_mean

LOG_RATIO_CLAMP = 20.0
"""|log(pi / pi_old)| is clamped to this before exp so a stray token never gives inf."""

PolicyLossFn = Callable[..., Tuple[Tensor, Dict[str, float]]]
POLICY_LOSSES = Registry("policy loss", config_key="algorithm.policy_loss")
POLICY_LOSS_OPTIONS: Dict[str, Dict[str, float]] = {}
"""loss name -> {option: default} (empty for a loss without options)."""


def register_policy_loss(
    name: str, options: Optional[Dict[str, float]] = None
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator that adds a loss to ``POLICY_LOSSES`` under ``name``.

    ``options`` declares the loss's extra hyper-parameters with their defaults; a loss that declares any is
    called with ``options=`` (a dict holding every declared option), one without is not.
    """

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES.register(name, fn)
        POLICY_LOSS_OPTIONS[name] = dict(options or {})
        return fn

    return decorator


def resolve_policy_loss_options(name: str, given: Optional[Dict[str, float]] = None) -> Dict[str, float]:
    """The options ``name`` runs with: its declared defaults updated by ``given``.

    Raises ``ValueError`` naming the loss and its allowed options for an option it does not declare, and for
    a value that is not a finite number.
    """
    POLICY_LOSSES[name]  # an unknown name raises UnknownName, naming the known ones
    allowed = POLICY_LOSS_OPTIONS[name]
    resolved = dict(allowed)
    for key, value in (given or {}).items():
        if key not in allowed:
            listing = ", ".join(sorted(allowed)) if allowed else "none"
            raise ValueError(f"policy loss {name!r} has no option {key!r}; its options: {listing}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"policy loss {name!r} option {key!r} must be a finite number, got {value!r}")
        resolved[key] = float(value)
    return resolved


def policy_loss(
    name: str,
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
    options: Optional[Dict[str, float]] = None,
) -> Tuple[Tensor, Dict[str, float]]:
    """Run the policy loss registered as ``name``; returns (scalar loss, metrics).

    ``is_weights`` [B, T] (e.g. truncated importance weights, see ``importance.tis_weights``)
    multiply the per-token loss; they carry no gradient. ``options``: the loss's extra hyper-parameters
    (``algorithm.policy_loss_options``), checked by ``resolve_policy_loss_options``.
    """
    resolved = resolve_policy_loss_options(name, options)
    check_same_shape(
        log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages, mask=mask, is_weights=is_weights
    )
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low} and {clip_high}")
    extra = {"options": resolved} if POLICY_LOSS_OPTIONS[name] else {}
    return POLICY_LOSSES[name](
        log_probs=log_probs,
        old_log_probs=old_log_probs,
        advantages=masked_fill_zero(advantages.detach(), mask),
        mask=mask,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_dual=clip_dual,
        agg_mode=agg_mode,
        norm_length=norm_length,
        is_weights=is_weights,
        **extra,
    )


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float, clip_dual: float
) -> Tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO surrogate loss with asymmetric and (optionally) dual clipping.

    Returns (loss [B, T], clipped [B, T] bool, dual_clipped [B, T] bool). ``clip_dual <= 1``
    (0 included) turns the dual clip off.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    if clip_dual > 1.0:
        dual_bound = -advantages * clip_dual
        is_dual = (advantages < 0) & (dual_bound < loss)
        loss = torch.where(is_dual, dual_bound, loss)
    else:
        is_dual = torch.zeros_like(is_clipped)
    return loss, is_clipped, is_dual


def finish_policy_loss(
    loss_mat: Tensor,
    is_clipped: Tensor,
    is_dual: Tensor,
    log_ratio: Tensor,
    mask: Tensor,
    agg_mode: str,
    norm_length: Optional[int],
    is_weights: Optional[Tensor],
) -> Tuple[Tensor, Dict[str, float]]:
    """Weight by ``is_weights``, aggregate and measure a per-token policy loss; returns (loss, metrics)."""
    if is_weights is not None:
        loss_mat = loss_mat * is_weights.detach()
    loss = aggregate_loss(loss_mat, mask, agg_mode, norm_length)
    with torch.no_grad():
        metrics = {
            "actor/clip_frac": masked_mean(is_clipped.float(), mask).item(),
            "actor/dual_clip_frac": masked_mean(is_dual.float(), mask).item(),
            "actor/ppo_kl": masked_mean(-log_ratio.float(), mask).item(),
        }
    return loss, metrics


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
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
) -> Tuple[Tensor, Dict[str, float]]:
    """PPO clip with the token ratio pi/pi_old, clip range (1 - clip_low, 1 + clip_high), dual clip."""
    log_ratio = masked_fill_zero(log_probs - old_log_probs.detach(), mask)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss_mat, is_clipped, is_dual = clipped_surrogate(ratio, advantages, clip_low, clip_high, clip_dual)
    return finish_policy_loss(loss_mat, is_clipped, is_dual, log_ratio, mask, agg_mode, norm_length, is_weights)


def sequence_log_ratio(log_probs: Tensor, old_log_probs: Tensor, mask: Tensor) -> Tensor:
    """GSPO's per-token log-ratio: its value is the sequence's mean log(pi/pi_old) on every token, while
    its gradient with respect to log pi(y_t) is 1 for that token (stop-gradient trick, "GSPO-token")::

        log s_{i,t} = log pi(y_t) - sg[log pi(y_t)] + sg[mean_t log(pi/pi_old)]
    """
    token_log_ratio = masked_fill_zero(log_probs - old_log_probs.detach(), mask)
    seq_mean = masked_mean(token_log_ratio, mask, dim=-1)
    return log_probs - log_probs.detach() + seq_mean.detach()[:, None]


@register_policy_loss("gspo")
def gspo_loss(
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
    """GSPO: the sequence-level ratio exp(mean_t log(pi/pi_old)), clipped per token. ``clip_dual`` is
    ignored (GSPO has no dual clip). With ``seq-mean-token-mean`` and a per-sequence advantage this is
    exactly the sequence-level GSPO objective.
    """
    seq_log_ratio = masked_fill_zero(sequence_log_ratio(log_probs, old_log_probs, mask), mask)
    ratio = torch.exp(seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    loss_mat, is_clipped, is_dual = clipped_surrogate(ratio, advantages, clip_low, clip_high, clip_dual=0.0)
    token_log_ratio = masked_fill_zero(log_probs - old_log_probs, mask)
    return finish_policy_loss(loss_mat, is_clipped, is_dual, token_log_ratio, mask, agg_mode, norm_length, is_weights)
