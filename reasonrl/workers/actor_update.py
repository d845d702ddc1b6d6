"""The actor's PPO-style update loop, a mixin of ``ActorRolloutRefWorker``: ``ppo_epochs`` passes over mini-batches,
each accumulated over micro-batches (fixed row counts or token budgets), the loss normalised by global (all-rank)
token or sequence counts so that any split of the batch across ranks and micro-batches gives the same gradient.

It uses the worker's ``actor`` (FSDP2), ``optimizer``, ``scheduler``, ``cfg``, ``batch_plan``, ``world_size``,
``device`` and its micro-batching and log-prob helpers (``_micro_batches``, ``_mb_log_probs``).
"""
from __future__ import annotations

import logging
from typing import Dict

import torch

from reasonrl.algorithms import aggregate_loss, kl_penalty, masked_sum, policy_loss, tis_weights
from reasonrl.algorithms.aggregation import masked_fill_zero
from reasonrl.data.batch import Batch
from reasonrl.data.collate import loss_mask
from reasonrl.data.micro_batches import loss_denominator

from .distributed import all_reduce_max, all_reduce_sum
from .fsdp import clip_grad_norm

log = logging.getLogger(__name__)


class PolicyUpdate:
    """The update of ``ActorRolloutRefWorker`` (see the module docstring)."""

    def _update_actor(self, batch: Batch, kl_coef: float) -> Dict[str, float]:
        a, alg = self.cfg.actor, self.cfg.algorithm
        self.actor.train()
        minis = batch.chunk(self.batch_plan.mini_batches_for(len(batch)))
        sums: Dict[str, float] = {}
        counts: Dict[str, int] = {}

        def add(key: str, value: float) -> None:
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1

        norm_length = self.cfg.rollout.max_new_tokens
        own_old = "old_log_probs" not in batch  # no old-log-prob pass: this update reports what it would have
        before = {"tokens": 0.0, "entropy": 0.0, "kl": 0.0, "diff": 0.0, "diff_max": 0.0}
        steps = {"taken": 0, "skipped": 0}
        for _ in range(self.batch_plan.ppo_epochs):
            for mini in minis:
                global_denom = all_reduce_sum(loss_denominator(loss_mask(mini), alg.loss_agg_mode),
                                              self.device)
                self.optimizer.zero_grad(set_to_none=True)
                for idx in self._micro_batches(mini, a.max_tokens_per_micro_batch):
                    mb = mini.select(idx).to(self.device)
                    mask = loss_mask(mb)  # response_mask without tool-turn tokens
                    # Each micro-batch's loss is its own mean; weighted by its share of the mini-batch's denominator
                    # the sum is the mini-batch's mean, whatever the grouping (x world size: FSDP averages ranks).
                    weight = loss_denominator(mask, alg.loss_agg_mode) / max(global_denom, 1e-8) * self.world_size
                    need_entropy = alg.entropy_coef != 0
                    lp, ent = self._mb_log_probs(self.actor, mb, need_entropy or own_old)
                    if own_old:
                        self._add_policy_sums(before, lp.detach(), ent.detach(), mb)
                    # Without an old-log-prob pass (config.passes.passes_needed: one update per batch) the policy is
                    # still the one that scored the batch: its own log-probs, detached, are the old ones (ratio 1).
                    old_lp = mb["old_log_probs"] if "old_log_probs" in mb else lp.detach()
                    is_w = None
                    if alg.tis_mode != "off":
                        is_w = tis_weights(old_lp, mb["rollout_log_probs"], mask, alg.tis_mode, alg.tis_cap)
                    pg, pg_metrics = policy_loss(alg.policy_loss, log_probs=lp, old_log_probs=old_lp,
                                                 advantages=mb["advantages"], mask=mask,
                                                 clip_low=alg.clip_ratio_low, clip_high=alg.clip_ratio_high,
                                                 clip_dual=alg.clip_ratio_dual, agg_mode=alg.loss_agg_mode,
                                                 norm_length=norm_length, is_weights=is_w,
                                                 options=dict(alg.policy_loss_options))
                    loss = pg
                    if alg.use_kl_loss and "ref_log_probs" in mb:
                        kl = aggregate_loss(kl_penalty(lp, mb["ref_log_probs"], alg.kl_loss_estimator), mask,
                                            alg.loss_agg_mode, norm_length)
                        loss = loss + kl_coef * kl
                        add("actor/kl_loss", kl.item())
                    if need_entropy:
                        ent_loss = aggregate_loss(ent, mask, alg.loss_agg_mode, norm_length)
                        loss = loss - alg.entropy_coef * ent_loss
                    (loss * weight).backward()
                    add("actor/pg_loss", pg.item())
                    for k, v in pg_metrics.items():
                        add(k, v)
                grad_norm = clip_grad_norm(self.actor, a.grad_clip)
                if torch.isfinite(torch.tensor(grad_norm)):
                    self.optimizer.step()
                    steps["taken"] += 1
                else:
                    log.warning("non-finite grad norm %s: skipping the optimizer step", grad_norm)
                    steps["skipped"] += 1
                self.scheduler.step()
                add("actor/grad_norm", grad_norm)
        metrics = {k: sums[k] / counts[k] for k in sums}
        # counts, the same on every rank (the gradient norm is global): the trainer stops a run of skipped steps
        metrics["actor/optimizer_steps"] = float(steps["taken"])
        metrics["actor/skipped_optimizer_steps"] = float(steps["skipped"])
        if own_old:
            metrics.update(self._policy_metrics(before, "ref_log_probs" in batch))
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    @staticmethod
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

    def _policy_metrics(self, sums: Dict[str, float], with_ref: bool) -> Dict[str, float]:
        """All ranks' token means of the sums above (the same keys as the trainer's metrics from the pass)."""
        tokens = max(all_reduce_sum(sums["tokens"], self.device), 1.0)
        out = {"actor/entropy": all_reduce_sum(sums["entropy"], self.device) / tokens,
               "rollout/logprob_diff_mean": all_reduce_sum(sums["diff"], self.device) / tokens,
               "rollout/logprob_diff_max": all_reduce_max(sums["diff_max"], self.device)}
        if with_ref:
            out["actor/kl"] = all_reduce_sum(sums["kl"], self.device) / tokens
        return out
