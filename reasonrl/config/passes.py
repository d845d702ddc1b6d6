"""Which teacher-forced passes a training step runs, decided from the config alone.

- old log-probs (the actor's own, before the update): needed when the batch is used for more than one optimizer
  step (``actor.ppo_epochs`` > 1 or several mini-batches), since from the second step on the policy has moved; and
  by ``algorithm.kl_in_reward``, whose token rewards are computed before the update; and by masked importance
  sampling (``algorithm.off_policy.correction=mis``), whose rejected tokens leave the loss's denominator, which is
  fixed before the update's first forward. With one optimizer step per
  batch the policy that scored the batch is the one being updated: the update's own log-probs, detached, are the old
  ones (the ratio is exactly 1, as TRL does when it takes one step per batch), and the update reports the entropy,
  KL and rollout-mismatch metrics that the pass would have given.
- reference log-probs: needed by a KL term (``algorithm.use_kl_loss`` or ``kl_in_reward``).
- values: needed by GAE (the critic).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple


@dataclass(frozen=True)
class Passes:
    old_log_probs: bool
    ref_log_probs: bool
    values: bool
    old_log_probs_reason: str = field(default="", compare=False)
    """Why the old-log-prob pass runs (the start-up table's words); empty when it does not."""


def updates_per_batch(batch) -> int:
    """Optimizer steps taken on one rollout batch (a ``BatchPlan``): epochs x mini-batches."""
    return batch.ppo_epochs * max(1, batch.mini_batches_per_step)


def needs_reference(cfg) -> bool:
    """A KL term needs the reference's log-probs (``algorithm.use_kl_loss`` or ``kl_in_reward``)."""
    return cfg.algorithm.use_kl_loss or cfg.algorithm.kl_in_reward


def passes_needed(cfg, batch) -> Passes:
    """The passes of ``cfg`` whose batch plan is ``batch``."""
    alg = cfg.algorithm
    steps = updates_per_batch(batch)
    reason = (f"{steps} optimizer steps per batch" if steps > 1 else "kl_in_reward" if alg.kl_in_reward else
              "masked IS: off_policy.correction=mis" if alg.off_policy.correction == "mis" else "")
    return Passes(old_log_probs=bool(reason), ref_log_probs=needs_reference(cfg),
                  values=alg.adv_estimator == "gae", old_log_probs_reason=reason)


def pass_rows(p: Passes) -> List[Tuple[str, str]]:
    """Rows for the start-up table: each pass, whether it runs, and why."""
    if p.old_log_probs:
        old = f"on ({p.old_log_probs_reason})"
    else:
        old = "off (one optimizer step per batch: the update's own log-probs)"
    return [
        ("pass: old log-probs", old),
        ("pass: ref log-probs", "on (KL term)" if p.ref_log_probs else "off (no KL term)"),
        ("pass: values (critic)", "on (gae)" if p.values else "off"),
    ]
