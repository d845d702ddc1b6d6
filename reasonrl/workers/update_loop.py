"""The update skeleton shared by the actor's policy update and the critic's value update.

``ppo_epochs`` passes over mini-batches; each mini-batch is one optimizer step, accumulated over micro-batches (fixed
row counts or token budgets). Each micro-batch's loss is its own mean; weighted by its share of the mini-batch's
denominator (summed over all ranks) the sum of the micro-batch gradients is the mini-batch's mean gradient, whatever
the grouping (x world size: FSDP averages the ranks' gradients). What differs between the actor and the critic is
only the micro-batch's loss (``MicroLoss``) and its denominator.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from reasonrl.data.batch import Batch
from reasonrl.data.collate import loss_mask

from .distributed import all_reduce_sum
from .fsdp import clip_grad_norm

log = logging.getLogger(__name__)

MicroLoss = Callable[[Batch, torch.Tensor], Tuple[torch.Tensor, Sequence[Tuple[str, float]]]]
"""(micro-batch on the device, its loss mask) -> (the micro-batch's mean loss, metrics to average: (key, value))."""


class UpdateMetrics:
    """Running means of per-micro-batch (or per-step) values, by key, in the order first seen."""

    def __init__(self) -> None:
        self.sums: Dict[str, float] = {}
        self.counts: Dict[str, int] = {}

    def add(self, key: str, value: float) -> None:
        """Add one value to ``key``'s mean."""
        self.sums[key] = self.sums.get(key, 0.0) + float(value)
        self.counts[key] = self.counts.get(key, 0) + 1

    def means(self) -> Dict[str, float]:
        """Each key's mean."""
        return {k: self.sums[k] / self.counts[k] for k in self.sums}


def run_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, *, num_minis: int,
               epochs: int, micro_batches: Callable[[Batch], List[List[int]]], micro_loss: MicroLoss,
               denominator: Callable[[torch.Tensor], float], device: str, world_size: int, grad_clip: float,
               prefix: str, scheduler: Optional[object] = None) -> Tuple[UpdateMetrics, Dict[str, int]]:
    """Run the update over ``batch`` (this rank's rows) and return its metrics and the optimizer steps
    ``{"taken": n, "skipped": m}`` (a step whose global gradient norm is not finite is skipped, with a warning).

    ``num_minis``: mini-batches the batch is cut into; ``micro_batches(mini)``: its row groups, one per forward (the
    same count on every rank: each forward is an FSDP collective); ``denominator(mask)``: what a micro-batch's mean
    divides by (summed over the ranks for the mini-batch); ``prefix``: of the ``<prefix>/grad_norm`` metric;
    ``scheduler``: stepped once per mini-batch when given."""
    metrics = UpdateMetrics()
    steps = {"taken": 0, "skipped": 0}
    minis = batch.chunk(num_minis) if len(batch) else []
    for _ in range(epochs):
        for mini in minis:
            global_denom = all_reduce_sum(denominator(loss_mask(mini)), device)
            optimizer.zero_grad(set_to_none=True)
            for idx in micro_batches(mini):
                mb = mini.select(idx).to(device)
                mask = loss_mask(mb)  # response_mask without tool-turn tokens
                weight = denominator(mask) / max(global_denom, 1e-8) * world_size
                loss, values = micro_loss(mb, mask)
                (loss * weight).backward()
                for key, value in values:
                    metrics.add(key, value)
            grad_norm = clip_grad_norm(model, grad_clip)
            if torch.isfinite(torch.tensor(grad_norm)):
                optimizer.step()
                steps["taken"] += 1
            else:
                log.warning("%s: non-finite grad norm %s: skipping the optimizer step", prefix, grad_norm)
                steps["skipped"] += 1
            if scheduler is not None:
                scheduler.step()
            metrics.add(f"{prefix}/grad_norm", grad_norm)
    return metrics, steps
