"""Padding-free packing: the valid tokens of a micro-batch's rows laid end to end in one row.

A rollout micro-batch is ``[rows, P + T]`` (prompts left-padded to P, responses right-padded to T). Packed, it is
``[1, N]`` with N the number of valid tokens, and position ids that restart at 0 for each sequence. Hugging Face
models (transformers 5.x) read such position ids, with ``attention_mask=None`` and no cache, as a packed batch: the
mask builders of sdpa, eager and flex_attention make it block-diagonal causal (one block per sequence), and the
flash-attention paths derive the variable-length boundaries from them. So every token sees exactly the tokens it
sees in the padded row, and no compute goes to padding.

``PackedRows`` also says where the response tokens are: ``predict_index`` holds the packed positions whose next-token
prediction scores a response token (the position just before it), ``labels`` those tokens, and ``unpack`` puts one
value per response token back into the ``[rows, T]`` layout (0 at padding).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class PackedRows:
    input_ids: Tensor       # [1, N] the valid tokens of every row, row after row
    position_ids: Tensor    # [1, N] each sequence's own positions, from 0
    predict_index: Tensor   # [K] packed position predicting each valid response token
    labels: Tensor          # [K] those response tokens
    rows: Tensor            # [K] the response token's row ...
    columns: Tensor         # [K] ... and column in the [rows, T] response layout
    shape: Tuple[int, int]  # (rows, T)

    def unpack(self, values: Tensor) -> Tensor:
        """[K, ...] values, one per response token -> [rows, T, ...], zero at padding (differentiable)."""
        out = values.new_zeros(self.shape + tuple(values.shape[1:]))
        return out.index_put((self.rows, self.columns), values)


def pack_rows(input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, response_width: int) -> PackedRows:
    """Pack ``[rows, P + T]`` rows (the last ``response_width`` = T columns are the responses) into one row.

    Valid tokens are those with ``attention_mask`` 1; each row's valid tokens must be contiguous and start at
    position 0 (as ``collate_rollout`` lays them out), and each response must follow at least one prompt token."""
    rows, width = input_ids.shape
    valid = attention_mask.bool()
    flat_valid = valid.reshape(-1)
    packed_ids = input_ids.reshape(-1)[flat_valid]
    packed_pos = position_ids.reshape(-1)[flat_valid]
    lengths = valid.sum(-1)
    starts = torch.cumsum(lengths, 0) - lengths
    if lengths.numel() and (packed_pos[starts[lengths > 0]] != 0).any():
        raise ValueError("pack_rows: every row's first valid token must be at position 0")
    # Index of each valid token in the packed row ([rows, P + T], meaningful where valid).
    packed_at = (torch.cumsum(flat_valid.long(), 0) - 1).view(rows, width)
    response_valid = valid[:, width - response_width:]
    row_idx, col_idx = response_valid.nonzero(as_tuple=True)
    target = packed_at[:, width - response_width:][row_idx, col_idx]
    first_of_row = starts[row_idx]
    if (target == first_of_row).any():
        raise ValueError("pack_rows: a response token has no token before it (empty prompt)")
    return PackedRows(input_ids=packed_ids[None], position_ids=packed_pos[None], predict_index=target - 1,
                      labels=packed_ids[target], rows=row_idx, columns=col_idx, shape=(rows, response_width))


def trimmed_columns(attention_mask: Tensor, response_width: int) -> Tuple[int, int]:
    """(first, response columns) of a padded micro-batch without its all-padding columns: prompt columns before
    ``first`` and response columns from ``response columns`` on hold no valid token in any row. Slicing
    ``[:, first:P + response columns]`` leaves every valid token's attention and positions as they were."""
    prompt_width = attention_mask.shape[1] - response_width
    any_valid = attention_mask.bool().any(0)
    prompt_cols = any_valid[:prompt_width].nonzero()
    first = int(prompt_cols[0]) if len(prompt_cols) else prompt_width
    response_cols = any_valid[prompt_width:].nonzero()
    kept = int(response_cols[-1]) + 1 if len(response_cols) else 0
    return first, max(kept, 1)
