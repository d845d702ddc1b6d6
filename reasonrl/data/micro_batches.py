"""Which rows go into which micro-batch, and how much each micro-batch's loss weighs.

``micro_batch_groups`` splits a (mini-)batch's rows either into fixed runs of ``rows`` consecutive rows, or, with a
token budget, by length: first-fit decreasing, so that each group's forward costs at most ``max_tokens`` tokens.
A group's cost is the sum of its rows' valid tokens when the micro-batch is packed (padding-free), or rows x the
group's longest prompt + longest response when it is padded (the micro-batch trimmed to its own widths). A row longer
than the budget gets a group of its own: a sequence is never split. The result is deterministic (ties by row index),
and each group lists its rows in ascending order; callers put outputs back in the original order by these indices.

FSDP runs every micro-batch's forward as a collective, so all ranks must run the same number: ``min_groups`` (the
largest count over the ranks) splits the largest groups until there are that many.

``loss_denominator`` is a micro-batch's share of its mini-batch's loss normaliser, for each ``loss_agg_mode``:
weighting each micro-batch's loss by local / global denominators gives the one-big-batch loss, whatever the split.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from reasonrl.algorithms.aggregation import agg_denominator


def fixed_size_groups(rows: int, size: int) -> List[List[int]]:
    """Consecutive runs of ``size`` rows (the last may be shorter)."""
    size = max(1, int(size))
    return [list(range(start, min(start + size, rows))) for start in range(0, rows, size)]


class _Group:
    def __init__(self) -> None:
        self.members: List[int] = []
        self.tokens = 0        # sum of row lengths
        self.prompt = 0        # longest prompt
        self.response = 0      # longest response

    def cost_with(self, prompt: int, response: int, packed: bool) -> int:
        if packed:
            return self.tokens + prompt + response
        return (len(self.members) + 1) * (max(self.prompt, prompt) + max(self.response, response))

    def add(self, row: int, prompt: int, response: int) -> None:
        self.members.append(row)
        self.tokens += prompt + response
        self.prompt, self.response = max(self.prompt, prompt), max(self.response, response)


def token_budget_groups(prompt_lengths: Sequence[int], response_lengths: Sequence[int], max_tokens: int,
                        packed: bool = True, min_groups: int = 1) -> List[List[int]]:
    """First-fit decreasing under ``max_tokens`` per group (see the module docstring); at least ``min_groups``
    groups (at most one per row)."""
    if len(prompt_lengths) != len(response_lengths):
        raise ValueError(f"{len(prompt_lengths)} prompt lengths but {len(response_lengths)} response lengths")
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    rows = len(prompt_lengths)
    if min_groups > rows:
        raise ValueError(f"cannot make {min_groups} micro-batches of {rows} rows")
    order = sorted(range(rows), key=lambda i: (-(prompt_lengths[i] + response_lengths[i]), i))
    groups: List[_Group] = []
    for i in order:
        p, r = int(prompt_lengths[i]), int(response_lengths[i])
        home: Optional[_Group] = next((g for g in groups if g.cost_with(p, r, packed) <= max_tokens), None)
        if home is None:
            home = _Group()
            groups.append(home)
        home.add(i, p, r)
    members = [g.members for g in groups]  # each in decreasing length order
    while len(members) < min_groups:  # halve the group with the most rows (the first such)
        k = max(range(len(members)), key=lambda j: (len(members[j]), -j))
        half = (len(members[k]) + 1) // 2
        members[k:k + 1] = [members[k][:half], members[k][half:]]
    return [sorted(m) for m in members]


def micro_batch_groups(attention_mask: torch.Tensor, response_width: int, rows_per_group: int, max_tokens: int,
                       packed: bool, agree: Callable[[int], int] = lambda n: n) -> List[List[int]]:
    """The micro-batches of a worker's rows ([rows, P + T] ``attention_mask``, responses in the last
    ``response_width`` columns): fixed runs of ``rows_per_group`` when ``max_tokens`` is 0, else token-budget groups.
    ``agree(count)`` returns the largest count over the ranks (an all-reduce); the groups are split up to it."""
    rows = attention_mask.shape[0]
    if max_tokens <= 0:
        return fixed_size_groups(rows, rows_per_group)
    prompt_width = attention_mask.shape[1] - response_width
    prompts = attention_mask[:, :prompt_width].sum(-1).tolist()
    responses = attention_mask[:, prompt_width:].sum(-1).tolist()
    groups = token_budget_groups(prompts, responses, max_tokens, packed)
    target = int(agree(len(groups)))
    if target > len(groups):
        groups = token_budget_groups(prompts, responses, max_tokens, packed, min_groups=target)
    return groups


def restore_order(parts: Sequence[torch.Tensor], groups: Sequence[Sequence[int]]) -> torch.Tensor:
    """Concatenate per-group outputs ([len(group), ...] each) back into the rows' original order."""
    index = torch.tensor([i for g in groups for i in g], dtype=torch.long)
    stacked = torch.cat(list(parts))
    out = torch.empty_like(stacked)
    out[index] = stacked
    return out


def loss_denominator(response_mask: torch.Tensor, loss_agg_mode: str) -> float:
    """What ``aggregate_loss`` divides by, for these rows (``algorithms.agg_denominator``, as a float)."""
    return float(agg_denominator(response_mask, loss_agg_mode))
