"""Per-token estimators of KL(actor || reference) from sampled-token log-probs (Schulman's k1/k2/k3).

With r = log pi_ref(y_t) - log pi(y_t) (the log-ratio ref/actor at the sampled token):
  * k1 = -r                       unbiased, can be negative, high variance
  * k2 = r**2 / 2                 biased, always >= 0, its gradient is that of the true KL at first order
  * k3 = exp(r) - r - 1           unbiased, always >= 0, low variance (GRPO's default)

Stability (k3): r is clamped to [-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP] before ``exp`` so float32
never overflows, and the result is clamped to at most ``K3_MAX``, so a handful of tokens the actor has
moved far from the reference cannot dominate the loss (their gradient is zero while clamped).
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.registry import Registry

from .aggregation import check_same_shape

K3_LOG_RATIO_CLAMP = 20.0
"""|log ratio| above this is clamped before exp in k3 (exp(20) ~ 4.9e8, finite in float32)."""
K3_MAX = 10.0
"""Upper bound on a single token's k3 value."""


def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k1 = log pi - log pi_ref."""
    return log_probs - ref_log_probs


def kl_k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k2 = 0.5 * (log pi - log pi_ref)^2."""
    return 0.5 * (log_probs - ref_log_probs) ** 2


def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k3 = exp(r) - r - 1 with r = log pi_ref - log pi (clamped, see the module docstring)."""
    r = (ref_log_probs - log_probs).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(r) - r - 1).clamp(max=K3_MAX)


KL_ESTIMATORS = Registry("KL estimator", config_key="algorithm.kl_loss_estimator / kl_reward_estimator")
for _name, _fn in (("k1", kl_k1), ("k2", kl_k2), ("k3", kl_k3)):
    KL_ESTIMATORS.register(_name, _fn)
_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}  # the names verl users know


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL estimate [B, T] between the actor and the reference at the sampled tokens.

    Mask it yourself (e.g. with ``aggregate_loss``); padding positions are not zeroed here.
    """
    check_same_shape(log_probs=log_probs, ref_log_probs=ref_log_probs)
    key = _ALIASES.get(estimator, estimator)
    return KL_ESTIMATORS[key](log_probs, ref_log_probs)
