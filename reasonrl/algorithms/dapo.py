"""DAPO's data-side pieces (Yu et al., 2025): dynamic-sampling group filter and overlong reward shaping."""

from __future__ import annotations

import torch
from torch import Tensor


def filter_groups(scores: Tensor, group_index: Tensor) -> Tensor:
    """Which responses to keep for dynamic sampling: those whose group's scores are not all identical.

    A group whose responses all scored the same (all right, all wrong, or a group of one) gives every
    member advantage 0 under group-relative estimators, so it carries no learning signal.
    Returns a bool [B].
    """
    if scores.shape != group_index.shape or scores.dim() != 1:
        raise ValueError(f"scores {tuple(scores.shape)} and group_index {tuple(group_index.shape)} must both be [B]")
    _, inverse = torch.unique(group_index, return_inverse=True)
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    scores = scores.float()
    group_max = torch.full((num_groups,), -torch.inf, device=scores.device).scatter_reduce(
        0, inverse, scores, reduce="amax"
    )
    group_min = torch.full((num_groups,), torch.inf, device=scores.device).scatter_reduce(
        0, inverse, scores, reduce="amin"
    )
    return (group_max > group_min)[inverse]


def overlong_penalty(response_lengths: Tensor, max_new_tokens: int, buffer: int, penalty: float) -> Tensor:
    """Soft length penalty to add to the score [B]: 0 up to ``max_new_tokens - buffer`` tokens, then
    linearly down to ``-penalty`` at ``max_new_tokens`` (and ``-penalty`` beyond). ``buffer <= 0``: all 0.
    """
    lengths = response_lengths.float()
    if buffer <= 0:
        return torch.zeros_like(lengths)
    if buffer > max_new_tokens:
        raise ValueError(f"overlong buffer ({buffer}) must not exceed max_new_tokens ({max_new_tokens})")
    start = max_new_tokens - buffer
    excess = (lengths - start).clamp(min=0, max=buffer)
    return -penalty * excess / buffer
