"""transformers' sdpa attention with no empty query rows: the root cause of the bf16 NaN gradients on the GPU.

A left-padded row's padding queries come before every real token, so with the causal and padding masks together they
may attend to no key at all: their mask row is all False. The outputs of those positions are never used (the loss
masks them), but the kernels do not agree on their gradients: on the H200 (torch 2.11, bf16) the backend torch's sdpa
picks by default, cuDNN attention, returns NaN query gradients for exactly those rows, and the NaN then spreads
through the backward into every weight (benchmarks/results/gpu_nan_probe.json: the first non-finite gradient is the
query gradient of the last layer's attention, at 72 positions, all of them fully masked queries; the MATH and
memory-efficient backends, eager attention and float32 give finite gradients on the same micro-batch).

The fix is at the mask: a query row with no key is given its own position as its one key (the diagonal), the
contract every backend handles. A real token's query never sees a padding key, so nothing it computes changes, and
a padding position's output stays unused. ``register_sdpa_without_empty_rows`` puts the wrapper under transformers'
``sdpa`` name; ``varlen_attention.prepared_attention`` calls it whenever a model loads with sdpa.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor


def unmask_empty_rows(mask: Optional[Tensor]) -> Optional[Tensor]:
    """``mask`` ([batch, heads or 1, queries, keys], bool: True attends; or additive float) with every query row that
    attends to no key opened on its own position (query i is key ``i + keys - queries``); the same tensor when no row
    is empty (the common case costs one reduction)."""
    if mask is None or mask.dim() != 4:
        return mask
    if mask.dtype == torch.bool:
        empty = ~mask.any(dim=-1, keepdim=True)
    else:
        empty = torch.isneginf(mask).all(dim=-1, keepdim=True)
    if not bool(empty.any()):
        return mask
    q_len, k_len = mask.shape[-2:]
    own = torch.zeros(q_len, k_len, dtype=torch.bool, device=mask.device)
    own[torch.arange(q_len, device=mask.device), torch.arange(q_len, device=mask.device) + (k_len - q_len)] = True
    if mask.dtype == torch.bool:
        return mask | (empty & own)
    return mask.masked_fill(empty & own, 0.0)


def sdpa_without_empty_rows(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                            attention_mask: Optional[Tensor], **kwargs: Any):
    """transformers' ``sdpa_attention_forward`` on ``unmask_empty_rows(attention_mask)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, unmask_empty_rows(attention_mask), **kwargs)


def register_sdpa_without_empty_rows() -> None:
    """Serve transformers' ``sdpa`` name with ``sdpa_without_empty_rows`` in this process; idempotent."""
    from transformers import AttentionInterface

    AttentionInterface.register("sdpa", sdpa_without_empty_rows)
