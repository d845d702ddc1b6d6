"""Token log-probabilities and entropies from logits, without a full-vocabulary float32 copy at once.

Logits of a causal LM are [B, T, V] with V ~ 50k-150k; a float32 ``log_softmax`` of all of them can be
larger than the model. Both functions can work on chunks of rows (``chunk_size`` rows of V logits at a
time), which bounds the transient float32 memory to chunk_size x V. Under autograd, the chunks that
backward needs are kept (as for any op); the saving is largest for no-grad passes (old/ref log-probs).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor


def _map_rows(fn: Callable[..., Tensor], rows: Tensor, *others: Tensor, chunk_size: int) -> Tensor:
    """Apply ``fn(rows[i:j], *(o[i:j] for o in others))`` chunk by chunk and concatenate (all at once if 0)."""
    if chunk_size <= 0 or rows.shape[0] <= chunk_size:
        return fn(rows, *others)
    pieces = [
        fn(rows[start : start + chunk_size], *(o[start : start + chunk_size] for o in others))
        for start in range(0, rows.shape[0], chunk_size)
    ]
    return torch.cat(pieces, dim=0)


def _entropy_rows(logits: Tensor) -> Tensor:
    """H = logsumexp(z) - sum_v softmax(z)_v * z_v, in float32 (stable for any logit scale)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def _label_log_prob_rows(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(z)[label] = z[label] - logsumexp(z), in float32."""
    logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor, chunk_size: int = 0) -> Tensor:
    """Entropy of softmax(logits) over the last dimension: [..., V] -> [...], float32."""
    flat = logits.reshape(-1, logits.shape[-1])
    return _map_rows(_entropy_rows, flat, chunk_size=chunk_size).reshape(logits.shape[:-1])


def log_probs_from_logits(logits: Tensor, labels: Tensor, chunk_size: int = 0) -> Tensor:
    """log p(labels) under softmax(logits): logits [B, T, V], labels [B, T] -> [B, T] float32.

    ``chunk_size > 0`` processes that many (b, t) rows at a time. Labels must be valid token ids
    (0 <= id < V) at every position, padding included (use the pad token id, not -100).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    vocab = logits.shape[-1]
    if labels.numel() and (labels.min() < 0 or labels.max() >= vocab):
        raise ValueError(f"labels must lie in [0, {vocab}); got min {labels.min().item()}, max {labels.max().item()}")
    flat_logits = logits.reshape(-1, vocab)
    flat_labels = labels.reshape(-1)
    out = _map_rows(_label_log_prob_rows, flat_logits, flat_labels, chunk_size=chunk_size)
    return out.reshape(labels.shape)
