"""The actor's micro-batch loss (policy loss, KL loss, entropy bonus) run through the shared update loop
(``update_loop.run_update``): ``ppo_epochs`` passes over mini-batches, each accumulated over micro-batches (fixed row
counts or token budgets), the loss normalised by global (all-rank) token or sequence counts so that any split of the
batch across ranks and micro-batches gives the same gradient.

Without an old-log-prob pass (``config.passes.passes_needed``: one update per batch) the update's own first forward of
each row stands in for it, and the update reports the metrics that pass would have given.

Off-policy corrections (``algorithm.off_policy``): tis and mis weight the registered policy loss
(``importance.correction_weights``); mis first drops the rows' rejected tokens from the loss mask (from the pass's
old log-probs), so they leave every term of the actor's loss and its denominator; decoupled runs
``decoupled_ppo_loss``.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Dict

import torch

from reasonrl.algorithms import (aggregate_loss, combine_sums, correction_weights, decoupled_ppo_loss, kl_penalty,
                                 masked_sum, mis_weights, off_policy_metrics, off_policy_sums, policy_loss)
from reasonrl.algorithms.aggregation import masked_fill_zero
from reasonrl.config.algorithm_schema import reported_version_lags
from reasonrl.data.batch import Batch
from reasonrl.data.collate import loss_mask
from reasonrl.data.micro_batches import loss_denominator

from .distributed import all_reduce_max, all_reduce_sum
from .update_loop import run_update


def policy_update(policy, batch: Batch, kl_coef: float) -> Dict[str, float]:
    """The update of ``policy`` (a ``Policy`` with an optimizer, on the device) over ``batch``; ``kl_coef``: the KL
    loss weight this step. Returns the step's ``actor/*`` metrics (and the skipped pass's, see the module)."""
    cfg = policy.cfg
    a, alg = cfg.actor, cfg.algorithm
    policy.model.train()
    norm_length = cfg.rollout.max_new_tokens
    own_old = "old_log_probs" not in batch  # no old-log-prob pass: this update reports what it would have
    before = {"tokens": 0.0, "entropy": 0.0, "kl": 0.0, "diff": 0.0, "diff_max": 0.0, "off_policy": {}}
    off = alg.off_policy
    off_kwargs = asdict(off)  # correction, level, cap, lower, upper
    if off.correction == "mis":  # the pass ran (config/passes.py): the rejected tokens leave the loss mask first
        batch = without_rejected(batch, off)
    need_entropy = alg.entropy_coef != 0

    def micro_loss(mb: Batch, mask: torch.Tensor):
        values = []
        lp, ent = policy.mb_log_probs(mb, need_entropy or own_old)
        if own_old:
            _add_policy_sums(before, lp.detach(), ent.detach(), mb)
            before["off_policy"] = combine_sums(before["off_policy"], off_policy_sums(
                lp.detach(), mb["rollout_log_probs"], loss_mask(mb), **off_kwargs,
                lag=mb["version_lag"] if "version_lag" in mb else None, lags=reported_version_lags(cfg)))
        # Without an old-log-prob pass the policy is still the one that scored the batch: its own log-probs,
        # detached, are the old ones (ratio 1).
        old_lp = mb["old_log_probs"] if "old_log_probs" in mb else lp.detach()
        clip = dict(advantages=mb["advantages"], mask=mask, clip_low=alg.clip_ratio_low,
                    clip_high=alg.clip_ratio_high, clip_dual=alg.clip_ratio_dual, agg_mode=alg.loss_agg_mode,
                    norm_length=norm_length)
        if off.correction == "decoupled":
            pg, pg_metrics = decoupled_ppo_loss(log_probs=lp, prox_log_probs=old_lp,
                                                behav_log_probs=mb["rollout_log_probs"], cap=off.cap, **clip)
        else:
            is_w = correction_weights(prox_log_probs=old_lp, behav_log_probs=mb["rollout_log_probs"], mask=mask,
                                      **off_kwargs)
            pg, pg_metrics = policy_loss(alg.policy_loss, log_probs=lp, old_log_probs=old_lp, is_weights=is_w,
                                         options=dict(alg.policy_loss_options), **clip)
        loss = pg
        if alg.use_kl_loss and "ref_log_probs" in mb:
            kl = aggregate_loss(kl_penalty(lp, mb["ref_log_probs"], alg.kl_loss_estimator), mask,
                                alg.loss_agg_mode, norm_length)
            loss = loss + kl_coef * kl
            values.append(("actor/kl_loss", kl.item()))
        if need_entropy:
            ent_loss = aggregate_loss(ent, mask, alg.loss_agg_mode, norm_length)
            loss = loss - alg.entropy_coef * ent_loss
        values.append(("actor/pg_loss", pg.item()))
        values.extend(pg_metrics.items())
        return loss, values

    sums, steps = run_update(policy.model, policy.optimizer, batch,
                             num_minis=policy.batch_plan.mini_batches_for(len(batch)),
                             epochs=policy.batch_plan.ppo_epochs,
                             micro_batches=lambda mini: policy.micro_batches(mini, a.max_tokens_per_micro_batch),
                             micro_loss=micro_loss, denominator=lambda m: loss_denominator(m, alg.loss_agg_mode),
                             device=policy.device, world_size=policy.world_size, grad_clip=a.grad_clip,
                             prefix="actor", scheduler=policy.scheduler)
    metrics = sums.means()
    # counts, the same on every rank (the gradient norm is global): the trainer stops a run of skipped steps
    metrics["actor/optimizer_steps"] = float(steps["taken"])
    metrics["actor/skipped_optimizer_steps"] = float(steps["skipped"])
    if own_old:
        metrics.update(_policy_metrics(before, "ref_log_probs" in batch, policy.device))
        metrics.update(off_policy_metrics(_all_reduce_sums(before["off_policy"], policy.device)))
    metrics["actor/lr"] = policy.scheduler.get_last_lr()[0]
    return metrics


def _add_policy_sums(sums: Dict[str, float], lp: torch.Tensor, ent: torch.Tensor, mb: Batch) -> None:
    """Masked sums for the metrics the old-log-prob pass gives (trainer.metrics.policy_metrics, the rollout
    mismatch), from the update's first (and only) forward of each row."""
    mask = loss_mask(mb)
    sums["tokens"] += float(mask.sum())
    sums["entropy"] += float(masked_sum(ent, mask))
    if "ref_log_probs" in mb:
        sums["kl"] += float(masked_sum(kl_penalty(lp, mb["ref_log_probs"], "k3"), mask))
    diff = masked_fill_zero((lp - mb["rollout_log_probs"]).abs(), mask)
    sums["diff"] += float(diff.sum())
    sums["diff_max"] = max(sums["diff_max"], float(diff.max()) if diff.numel() else 0.0)


def _policy_metrics(sums: Dict[str, float], with_ref: bool, device: str) -> Dict[str, float]:
    """All ranks' token means of the sums above (the same keys as the trainer's metrics from the pass)."""
    tokens = max(all_reduce_sum(sums["tokens"], device), 1.0)
    out = {"actor/entropy": all_reduce_sum(sums["entropy"], device) / tokens,
           "rollout/logprob_diff_mean": all_reduce_sum(sums["diff"], device) / tokens,
           "rollout/logprob_diff_max": all_reduce_max(sums["diff_max"], device)}
    if with_ref:
        out["actor/kl"] = all_reduce_sum(sums["kl"], device) / tokens
    return out


def without_rejected(batch: Batch, off) -> Batch:
    """``batch`` with masked IS's rejected tokens (or sequences) out of its loss mask: their weight pi_prox / pi_behav
    (from the pass's ``old_log_probs``) falls outside [off.lower, off.upper]."""
    mask = loss_mask(batch)
    _, kept = mis_weights(batch["old_log_probs"], batch["rollout_log_probs"], mask, off.level, off.lower, off.upper)
    out = Batch(dict(batch.tensors), dict(batch.meta))
    out["loss_mask"] = kept.to(mask.dtype)
    return out


def _all_reduce_sums(sums: Dict[str, float], device: str) -> Dict[str, float]:
    """``off_policy_sums`` over all ranks (the keys are the same on every rank): ``_max`` keys by max, ``_min`` keys
    by min (the max of the negated values), the others summed."""
    out = {}
    for key in sorted(sums):
        if key.endswith("_max"):
            out[key] = all_reduce_max(sums[key], device)
        elif key.endswith("_min"):
            out[key] = -all_reduce_max(-sums[key], device)
        else:
            out[key] = all_reduce_sum(sums[key], device)
    return out
