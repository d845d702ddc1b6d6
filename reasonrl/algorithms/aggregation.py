"""Masked reductions and loss aggregation over a [B, T] response-token matrix.

Every function here takes a response ``mask`` of 0/1 (float or bool, shape [B, T]); masked-out
(padding) positions never contribute, whatever value they hold (NaN/inf included).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from reasonrl.registry import Registry



def check_same_shape(**tensors: Tensor) -> None:
    """Raise ``ValueError`` naming the arguments when the given tensors do not share one shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if t is not None}
    if len(set(shapes.values())) > 1:
        listing = ", ".join(f"{name}={shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch: {listing}")


def masked_fill_zero(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` with every masked-out position set to exactly 0 (NaN/inf there is dropped too)."""
    return torch.where(mask.bool(), values, torch.zeros_like(values))


def masked_sum(values: Tensor, mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Sum of ``values`` over valid positions (all of them, or along ``dim``)."""
    filled = masked_fill_zero(values, mask)
    return filled.sum() if dim is None else filled.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Mean of ``values`` over valid positions; 0 where there is no valid position."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``values`` over all valid positions (Bessel-corrected by default; 0 for < 2 tokens)."""
    mean = masked_mean(values, mask)
    sq_dev = masked_sum((values - mean) ** 2, mask)
    count = mask.to(values.dtype).sum()
    return sq_dev / (count - 1 if unbiased else count).clamp(min=1)


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """(values - mean) / (std + eps) with mean/std over all valid positions; 0 outside the mask."""
    mean = masked_mean(values, mask)
    std = masked_var(values, mask).sqrt()
    return masked_fill_zero((values - mean) / (std + eps), mask)


def _token_mean(loss_mat: Tensor, mask: Tensor, norm_length: Optional[int]) -> Tensor:
    """Every valid token of the batch weighs the same."""
    return masked_mean(loss_mat, mask)


def _seq_mean_token_mean(loss_mat: Tensor, mask: Tensor, norm_length: Optional[int]) -> Tensor:
    """Mean over each sequence's valid tokens, then mean over the sequences that have any."""
    per_seq = masked_mean(loss_mat, mask, dim=-1)
    has_tokens = mask.bool().any(dim=-1)
    return masked_mean(per_seq, has_tokens)


def _seq_mean_token_sum_norm(loss_mat: Tensor, mask: Tensor, norm_length: Optional[int]) -> Tensor:
    """Dr.GRPO: each sequence's token sum divided by a constant length, then mean over all B sequences."""
    length = loss_mat.shape[-1] if norm_length is None else norm_length
    if length <= 0:
        raise ValueError(f"norm_length must be positive, got {norm_length}")
    per_seq = masked_sum(loss_mat, mask, dim=-1) / length
    return per_seq.mean()


def _seq_mean_token_sum(loss_mat: Tensor, mask: Tensor, norm_length: Optional[int]) -> Tensor:
    """Each sequence's token sum, then mean over the sequences that have a valid token (longer answers weigh
    more, in proportion to their length)."""
    per_seq = masked_sum(loss_mat, mask, dim=-1)
    has_tokens = mask.bool().any(dim=-1)
    return masked_mean(per_seq, has_tokens)


LOSS_AGGREGATIONS = Registry("loss aggregation mode", config_key="algorithm.loss_agg_mode")
"""Loss aggregations by name: ``fn(loss_mat [B, T], mask [B, T], norm_length) -> scalar``."""
for _name, _fn in (("token-mean", _token_mean), ("seq-mean-token-mean", _seq_mean_token_mean),
                   ("seq-mean-token-sum", _seq_mean_token_sum), ("seq-mean-token-sum-norm", _seq_mean_token_sum_norm)):
    LOSS_AGGREGATIONS.register(_name, _fn)
LOSS_AGG_MODES = tuple(LOSS_AGGREGATIONS)
"""The names ``aggregate_loss`` accepts."""


def agg_denominator(mask: Tensor, mode: str) -> Tensor:
    """What ``aggregate_loss`` divides by for these rows (a 0-d tensor): valid tokens (token-mean), rows with a
    valid token (seq-mean-token-mean, seq-mean-token-sum) or all rows (seq-mean-token-sum-norm).

    A mini-batch split into micro-batches gives the mini-batch's loss when each micro-batch's loss is weighted
    by its share of this denominator.
    """
    LOSS_AGGREGATIONS[mode]  # an unknown mode raises UnknownName, naming the known ones
    valid = mask.bool()
    if mode == "token-mean":
        return valid.sum()
    if mode == "seq-mean-token-sum-norm":
        return torch.tensor(valid.shape[0], device=valid.device)
    return valid.any(dim=-1).sum()


def aggregate_loss(
    loss_mat: Tensor, mask: Tensor, mode: str = "token-mean", norm_length: Optional[int] = None
) -> Tensor:
    """Reduce a per-token loss matrix [B, T] to a scalar.

    Modes:
      * ``token-mean``: sum over valid tokens / number of valid tokens (longer answers weigh more).
      * ``seq-mean-token-mean``: per-sequence token mean, then mean over non-empty sequences.
      * ``seq-mean-token-sum``: per-sequence token sum, then mean over non-empty sequences.
      * ``seq-mean-token-sum-norm``: per-sequence token sum / ``norm_length`` (the max response
        length; defaults to T), then mean over all B sequences — the constant normaliser of Dr.GRPO.
    """
    check_same_shape(loss_mat=loss_mat, mask=mask)
    return LOSS_AGGREGATIONS[mode](loss_mat, mask, norm_length)
