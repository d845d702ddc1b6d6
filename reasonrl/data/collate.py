"""Completions -> the padded tensors the workers train on.

Layout per row: prompt left-padded to P, response right-padded to T; ``input_ids`` is [R, P + T].
``response_mask`` marks every response token; ``loss_mask`` those the policy produced, i.e. without the tool turns of
a multi-turn rollout (``tool_masks``): the policy loss, KL, entropy, advantages and the critic use ``loss_mask``.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from .batch import Batch


def collate_rollout(prompt_ids: Sequence[List[int]], response_ids: Sequence[List[int]],
                    rollout_log_probs: Sequence[List[float]], pad_id: int,
                    tool_masks: Optional[Sequence[List[int]]] = None) -> Batch:
    rows = len(prompt_ids)
    P = max(len(p) for p in prompt_ids)
    T = max(1, max(len(r) for r in response_ids))
    input_ids = torch.full((rows, P + T), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, P + T), dtype=torch.long)
    response_mask = torch.zeros((rows, T), dtype=torch.float32)
    rollout_lp = torch.zeros((rows, T), dtype=torch.float32)
    for i, (p, r, lp) in enumerate(zip(prompt_ids, response_ids, rollout_log_probs)):
        input_ids[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        attention[i, P - len(p):P] = 1
        if r:
            input_ids[i, P:P + len(r)] = torch.tensor(r, dtype=torch.long)
            attention[i, P:P + len(r)] = 1
            response_mask[i, :len(r)] = 1.0
            rollout_lp[i, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    batch = Batch({
        "input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids,
        "responses": input_ids[:, P:].clone(), "response_mask": response_mask, "rollout_log_probs": rollout_lp,
    })
    if tool_masks is not None:
        tool = torch.zeros((rows, T), dtype=torch.float32)
        for i, (r, m) in enumerate(zip(response_ids, tool_masks)):
            if len(m) != len(r):
                raise ValueError(f"row {i}: tool mask has {len(m)} entries for {len(r)} response tokens")
            if m:
                tool[i, :len(m)] = torch.tensor(m, dtype=torch.float32)
        batch["loss_mask"] = response_mask * (1.0 - tool)
    return batch


def loss_mask(batch: Batch) -> torch.Tensor:
    """The tokens the policy produced: ``loss_mask`` when the rollout had tool turns, else ``response_mask``."""
    return batch["loss_mask"] if "loss_mask" in batch else batch["response_mask"]
