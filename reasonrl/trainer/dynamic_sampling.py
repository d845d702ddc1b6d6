"""DAPO dynamic sampling: keep only prompt groups whose rewards differ, and roll out more prompts to refill the batch.

A group whose responses all scored the same gives every response advantage 0 under group-relative
estimators; training on it only adds noise (KL, entropy) and dilutes the token-mean. ``refill_informative_groups``
keeps the informative groups of the first round, samples further rounds (at most ``max_rounds`` extra) until
``target_groups`` are kept, and trims the result so every data-parallel rank and every mini-batch gets equal work.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Tuple

import torch

from reasonrl.algorithms import filter_groups
from reasonrl.data.sample import Round


def usable_groups(kept: int, world_size: int, mini_batch_prompts: int) -> int:
    """How many of ``kept`` groups to train on so that the rows split evenly over ranks and mini-batches.

    With at least one aligned set (lcm of world size and mini-batch prompts) the count is a multiple of it, so every
    rank gets the same number of full mini-batches. With fewer, it is a multiple of the world size below the
    mini-batch size: a single (short) mini-batch on every rank.
    """
    if kept <= 0:
        return 0
    unit = math.lcm(world_size, mini_batch_prompts)
    if kept >= unit:
        return kept - kept % unit
    cap = kept if mini_batch_prompts % world_size == 0 else min(kept, mini_batch_prompts - 1)
    return cap - cap % world_size


def informative_group_ids(rnd: Round) -> List[int]:
    """The round's groups (``Sample.group``) whose verdicts' scores are not all equal, in group order (responses
    without a verdict, ``failed``, do not count: their score 0 is no outcome)."""
    judged = [s for s in rnd.samples if not getattr(s.result, "failed", False)]
    if not judged:
        return []
    scores = torch.tensor([float(s.result.score) for s in judged], dtype=torch.float32)
    group_index = torch.tensor([s.group for s in judged])
    keep = filter_groups(scores, group_index)
    kept_groups = {int(g) for g, k in zip(group_index, keep) if bool(k)}
    return sorted(kept_groups)


def refill_informative_groups(first: Round, sample_round: Callable[[], Round], target_groups: int,
                              max_rounds: int, world_size: int, mini_batch_prompts: int
                              ) -> Tuple[Round, Dict[str, float]]:
    """Keep informative groups from ``first`` and from up to ``max_rounds`` further ``sample_round()`` calls until
    ``target_groups`` are kept; trim to ``usable_groups``. If none are usable, fall back to the whole first round
    (its advantages are all 0; the step still runs, and ``dynamic_sampling/fallback`` says so)."""
    kept: List[Round] = []
    kept_count, sampled, rounds = 0, 0, 0
    rnd = first
    while True:
        rounds += 1
        sampled += len(rnd.prompts)
        ids = informative_group_ids(rnd)[: max(0, target_groups - kept_count)]
        if ids:
            kept.append(rnd.select_groups(ids))
            kept_count += len(ids)
        if kept_count >= target_groups or rounds > max_rounds:
            break
        rnd = sample_round()
    informative = kept_count
    use = usable_groups(kept_count, world_size, mini_batch_prompts)
    metrics = {"dynamic_sampling/rounds": float(rounds), "dynamic_sampling/groups_sampled": float(sampled),
               "dynamic_sampling/groups_informative": float(informative),
               "dynamic_sampling/groups_kept": float(use), "dynamic_sampling/groups_dropped": float(sampled - use),
               "dynamic_sampling/fallback": 0.0}
    if use == 0:
        metrics.update({"dynamic_sampling/fallback": 1.0, "dynamic_sampling/groups_kept": float(len(first.prompts)),
                        "dynamic_sampling/groups_dropped": float(sampled - len(first.prompts))})
        return first, metrics
    return Round.concat(kept).select_groups(range(use)), metrics
