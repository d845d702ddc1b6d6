"""Off-policy statistics of a batch: the importance weights the loss applies and the gap between the behaviour policy
(the engine's log-probs) and the proximal policy (the trainer's ``old_log_probs``), by version lag.

Computed in two steps so that any split of the batch (micro-batches, ranks) gives the same numbers:
``off_policy_sums`` returns additive sums (keys ending ``_max`` / ``_min`` combine by max / min instead,
``combine_sums``), and ``off_policy_metrics`` turns the combined sums into metrics:

* ``offpolicy/kl``: mean over valid tokens of k3 = exp(x) - x - 1 with x = log pi_prox - log pi_behav, an unbiased,
  non-negative estimate of KL(pi_behav || pi_prox) from pi_behav's samples (per token at most ``kl.K3_MAX``).
  The mean |x| over all tokens is ``rollout/logprob_diff_mean`` (``importance.logprob_mismatch_stats``).
* ``offpolicy/logprob_gap/lag_<k>`` and ``offpolicy/kl/lag_<k>``: mean |x| and mean k3 over the valid tokens whose
  version lag is k (the trainer's weight version minus the version that generated the token), for each lag in
  ``lags`` that has tokens; only when the batch carries a lag ([B] per sample, or [B, T] per token).
* with a correction on, over the weight's units (valid tokens at level token; sequences with a valid token at level
  sequence), w = pi_prox / pi_behav (|log w| clamped to ``importance.WEIGHT_LOG_CLAMP``):
  ``offpolicy/is_weight_mean`` / ``_max`` / ``_min`` of w before truncation or masking;
  ``offpolicy/is_truncated_frac`` (tis, decoupled): share of units with w > cap;
  ``offpolicy/is_masked_frac`` (mis): share of units outside [lower, upper];
  ``offpolicy/is_ess``: the effective sample size of the weights the loss applies, as a share of the units,
  (sum v)^2 / (n sum v^2) with v the applied weights (1: all equal; 0 when every unit is masked).
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import torch
from torch import Tensor

from .aggregation import check_same_shape, masked_fill_zero
from .importance import CORRECTIONS, WEIGHT_LOG_CLAMP, log_is_ratio, mis_weights, tis_weights
from .kl import kl_k3


def _per_unit(values: Tensor, mask: Tensor, level: str) -> Tensor:
    """The 1-D values of the weight's units: each valid token (token), or each sequence with a valid token, read at
    its first valid token (sequence: the value is the same on all of them)."""
    valid = mask.bool()
    if level == "token":
        return values[valid]
    first = valid.float().argmax(dim=-1, keepdim=True)
    return values.gather(1, first).squeeze(1)[valid.any(dim=-1)]


def _lag_sums(gap: Tensor, k3: Tensor, valid: Tensor, lag: Tensor, lags: Sequence[int]) -> Dict[str, float]:
    lag = lag[:, None].expand_as(valid) if lag.dim() == 1 else lag
    check_same_shape(lag=lag, mask=valid)
    unknown = sorted(set(lag[valid].tolist()) - set(lags))
    if unknown:
        raise ValueError(f"version lag(s) {unknown} outside the expected lags {list(lags)}")
    out: Dict[str, float] = {}
    for k in lags:
        sel = valid & (lag == k)
        out[f"gap/tokens/lag_{k}"] = float(sel.sum())
        out[f"gap/abs/lag_{k}"] = float(gap[sel].sum())
        out[f"gap/kl/lag_{k}"] = float(k3[sel].sum())
    return out


def off_policy_sums(prox_log_probs: Tensor, behav_log_probs: Tensor, mask: Tensor, *, correction: str = "none",
                    level: str = "token", cap: float = math.inf, lower: float = 0.0, upper: float = math.inf,
                    lag: Optional[Tensor] = None, lags: Sequence[int] = ()) -> Dict[str, float]:
    """The additive sums of this batch (or micro-batch), see the module docstring. ``level`` is forced to token for
    ``decoupled``; ``lags``: the lags to report (the key set is the same on every rank; a lag outside it is an
    error)."""
    check_same_shape(prox_log_probs=prox_log_probs, behav_log_probs=behav_log_probs, mask=mask)
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown off-policy correction {correction!r}; choose one of {CORRECTIONS}")
    with torch.no_grad():
        valid = mask.bool()
        gap = masked_fill_zero((prox_log_probs.float() - behav_log_probs.float()).abs(), valid)
        k3 = masked_fill_zero(kl_k3(behav_log_probs.float(), prox_log_probs.float()), valid)
        sums = {"gap/tokens": float(valid.sum()), "gap/kl": float(k3.sum())}
        if lag is not None:
            sums.update(_lag_sums(gap, k3, valid, lag.to(valid.device), lags))
        if correction == "none":
            return sums
        level = "token" if correction == "decoupled" else level
        log_w = log_is_ratio(prox_log_probs, behav_log_probs, mask, level)
        w = _per_unit(torch.exp(log_w.clamp(-WEIGHT_LOG_CLAMP, WEIGHT_LOG_CLAMP)), valid, level)
        if correction == "mis":
            applied = _per_unit(mis_weights(prox_log_probs, behav_log_probs, mask, level, lower, upper)[0], valid,
                                level)
            sums["is/masked"] = float(((w < lower) | (w > upper)).sum())
        else:
            applied = _per_unit(tis_weights(prox_log_probs, behav_log_probs, mask, level, cap), valid, level)
            sums["is/truncated"] = float((w > cap).sum())
        sums.update({"is/units": float(w.numel()), "is/w": float(w.sum()),
                     "is/w_max": float(w.max()) if w.numel() else -math.inf,
                     "is/w_min": float(w.min()) if w.numel() else math.inf,
                     "is/applied": float(applied.sum()), "is/applied_sq": float((applied ** 2).sum())})
        return sums


def combine_sums(a: Dict[str, float], b: Dict[str, float]) -> Dict[str, float]:
    """Two batches' sums as one's (keys ending ``_max`` / ``_min`` by max / min, the others added)."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif key.endswith("_max"):
            out[key] = max(out[key], value)
        elif key.endswith("_min"):
            out[key] = min(out[key], value)
        else:
            out[key] += value
    return out


def off_policy_metrics(sums: Dict[str, float]) -> Dict[str, float]:
    """The ``offpolicy/*`` metrics of combined sums (see the module docstring); nothing for an empty group."""
    out: Dict[str, float] = {}
    if sums.get("gap/tokens", 0) > 0:
        out["offpolicy/kl"] = sums["gap/kl"] / sums["gap/tokens"]
    for key in sorted(k for k in sums if k.startswith("gap/tokens/lag_")):
        suffix = key[len("gap/tokens/"):]
        if sums[key] > 0:
            out[f"offpolicy/logprob_gap/{suffix}"] = sums[f"gap/abs/{suffix}"] / sums[key]
            out[f"offpolicy/kl/{suffix}"] = sums[f"gap/kl/{suffix}"] / sums[key]
    units = sums.get("is/units", 0)
    if units > 0:
        out.update({"offpolicy/is_weight_mean": sums["is/w"] / units, "offpolicy/is_weight_max": sums["is/w_max"],
                    "offpolicy/is_weight_min": sums["is/w_min"]})
        if "is/truncated" in sums:
            out["offpolicy/is_truncated_frac"] = sums["is/truncated"] / units
        if "is/masked" in sums:
            out["offpolicy/is_masked_frac"] = sums["is/masked"] / units
        sq = sums["is/applied_sq"]
        out["offpolicy/is_ess"] = sums["is/applied"] ** 2 / (units * sq) if sq > 0 else 0.0
    return out
