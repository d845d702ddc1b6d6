"""Samples without a verdict, and steps that trained nothing: never a silent zero, never a silent success.

A *failed* sample (``VerifyResult.failed``: the verifier timed out, crashed, raised, returned a non-finite or
out-of-range score or something that is not a result) is not a wrong answer. It is left out of its group's advantage
and of the loss (its loss-mask row is zeroed), counted per verifier (``reward/failed*``), and a step in which more than
``reward.max_failed_fraction`` of the responses failed stops the run with a message naming the verifiers and reasons.

A step whose every optimizer step was skipped (non-finite gradient norm) trained nothing; after
``trainer.max_skipped_steps`` such steps in a row the run stops, naming the cause.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Dict, Sequence, Tuple

import torch
from torch import Tensor


EXIT_HALTED = 5
"""``reasonrl.train``'s exit status when a RunHaltedError stops the run."""


class RunHaltedError(RuntimeError):
    """The run cannot train on: too many responses without a verdict, or a run of steps that updated nothing."""


def verdict_mask(results: Sequence[Any]) -> Tensor:
    """[B] bool: True for the responses that got a verdict (not ``failed``)."""
    return torch.tensor([not getattr(r, "failed", False) for r in results], dtype=torch.bool)


def failure_metrics(results: Sequence[Any], verifiers: Sequence[str]) -> Dict[str, float]:
    """``reward/failed_count``, ``reward/failed_frac`` and, per verifier with any failure, ``reward/<v>/failed``."""
    failed = [i for i, r in enumerate(results) if getattr(r, "failed", False)]
    out = {"reward/failed_count": float(len(failed)), "reward/failed_frac": len(failed) / max(1, len(results))}
    for name, count in Counter(verifiers[i] for i in failed).items():
        out[f"reward/{name}/failed"] = float(count)
    return out


def check_failed_fraction(results: Sequence[Any], verifiers: Sequence[str], max_fraction: float, step: int) -> None:
    """Raise RunHaltedError when more than ``max_fraction`` of ``results`` failed, naming each verifier's count and
    its most common reasons."""
    failed = [i for i, r in enumerate(results) if getattr(r, "failed", False)]
    if not results or len(failed) / len(results) <= max_fraction:
        return
    parts = []
    for name, count in sorted(Counter(verifiers[i] for i in failed).items()):
        reasons = Counter(str(results[i].info.get("reason", "?"))[:120] for i in failed if verifiers[i] == name)
        listed = "; ".join(f"{reason} (x{n})" for reason, n in reasons.most_common(3))
        parts.append(f"{name}: {count} ({listed})")
    raise RunHaltedError(
        f"step {step}: {len(failed)} of {len(results)} responses got no verdict from their verifier, more than "
        f"reward.max_failed_fraction={max_fraction:g} — {'; '.join(parts)}. Fix the verifier or its service "
        f"(reward.timeout_s, reward.score_range), or raise reward.max_failed_fraction to train on the rest.")


def without_failed(mask: Tensor, verdicts: Tensor) -> Tensor:
    """The loss mask with the rows of failed responses zeroed ([B, T] x [B] -> [B, T])."""
    return mask * verdicts.to(mask.dtype)[:, None]


def advantages_over_verdicts(compute: Callable[..., Tuple[Tensor, Tensor]], verdicts: Tensor, *, mask: Tensor,
                             **inputs: Any) -> Tuple[Tensor, Tensor]:
    """``compute(mask=..., **inputs)`` over the responses with a verdict only: every tensor input with one row per
    response (scores, group_index, token_rewards, values, baseline_scores) is cut to those rows, so a failed response
    neither takes part in its group's baseline nor in the batch's whitening; it gets advantage and return 0. With every
    response verdicted this is ``compute`` itself."""
    if bool(verdicts.all()):
        return compute(mask=mask, **inputs)
    keep = verdicts.nonzero().squeeze(-1)
    adv, ret = torch.zeros(mask.shape), torch.zeros(mask.shape)
    if len(keep) == 0:
        return adv, ret
    rows = len(verdicts)
    picked = {k: v[keep] if isinstance(v, Tensor) and v.dim() >= 1 and v.shape[0] == rows else v
              for k, v in inputs.items()}
    sub_adv, sub_ret = compute(mask=mask[keep], **picked)
    adv[keep], ret[keep] = sub_adv.to(adv.dtype), sub_ret.to(ret.dtype)
    return adv, ret


class SkippedStepGuard:
    """Counts steps in a row whose every optimizer step was skipped; ``observe`` raises past ``limit`` (0: never)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_a_row = 0

    def observe(self, update: Dict[str, float], step: int) -> None:
        skipped = update.get("actor/skipped_optimizer_steps", 0.0)
        taken = update.get("actor/optimizer_steps", 0.0)
        self.in_a_row = self.in_a_row + 1 if skipped > 0 and taken == 0 else 0
        if self.limit and self.in_a_row >= self.limit:
            raise RunHaltedError(
                f"step {step}: every optimizer step of the last {self.in_a_row} steps was skipped because the "
                f"gradient norm was not finite (NaN/inf loss): nothing is being trained. Look for non-finite rewards "
                f"or advantages, or lower actor.lr; trainer.max_skipped_steps=0 turns this stop off.")

