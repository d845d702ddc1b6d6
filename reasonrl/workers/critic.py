"""Critic: one data-parallel rank of the PPO value model (FSDP2), colocated with the actor's rank.

It holds a ``ValueModel`` (causal-LM backbone + scalar head) with its own AdamW. ``compute_values`` scores the
response positions of a rollout batch; ``update_critic`` regresses the values toward the returns with the clipped
value loss. Checkpoints go into a ``critic/`` subfolder of the step's checkpoint directory.

With ``critic.offload_params`` / ``critic.offload_optimizer`` the value model's shards (and gradients) / its optimizer
state live in CPU memory except inside ``compute_values`` (shards), ``update_critic`` and checkpointing (both), leaving
the shared GPU to the actor's process and its rollout engine the rest of the step.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from reasonrl.algorithms import explained_variance, masked_mean, value_loss
from reasonrl.config import from_dict
from reasonrl.config.worker_plan import WorkerPlan
from reasonrl.data.batch import Batch
from reasonrl.data.collate import loss_mask
from reasonrl.data.micro_batches import micro_batch_groups, restore_order
from reasonrl.models import torch_dtype
from reasonrl.models.value_head import ValueModel, load_value_state_dict, micro_batch_values

from .dispatch import ONE_TO_ALL, SPLIT_BATCH, SPLIT_METRICS, dispatch
from .distributed import all_reduce_max, start_rank
from .fsdp import Offloader, full_state_dict, load_full_state_dict, shard_model
from .optim import build_adamw
from .update_loop import run_update


CHECKPOINT_SUBDIR = "critic"


class CriticWorker:
    """Same constructor as ``ActorRolloutRefWorker`` so one ``WorkerGroup`` recipe builds either."""

    def __init__(self, config: Dict[str, Any], model_path: str, rank: int, world_size: int, master_addr: str,
                 master_port: int, num_threads: int = 0, *, plan: WorkerPlan) -> None:
        self.cfg = from_dict(config)
        self.rank, self.world_size = rank, world_size
        # The trainer's plan: the same mini- and micro-batches as the actor.
        self.batch_plan = plan.batch
        self.device, self.mesh = start_rank(plan.device, self.cfg.trainer.seed, rank, world_size,
                                            master_addr, master_port, num_threads)
        c = self.cfg.critic
        path = c.model_path or model_path
        self.model = ValueModel.from_pretrained(path, torch.float32, self.cfg.model.trust_remote_code,
                                                self.cfg.model.attn_implementation, self.device)
        if self.cfg.model.gradient_checkpointing:
            self.model.model.gradient_checkpointing_enable()
        self.model.config.use_cache = False
        shard_model(self.model, self.mesh, self.device, torch_dtype(self.cfg.model.dtype, self.device))
        self.optimizer = build_adamw(self.model.parameters(), self.cfg, c.lr, self.device)
        self.offload = Offloader("critic", self.model, self.device, c.offload_params, self.optimizer,
                                 c.offload_optimizer)
        self.offload.offload()

    # ------------------------------------------------------------------ values
    def _values(self, mb: Batch) -> torch.Tensor:
        mb_mask = loss_mask(mb)  # the policy's tokens: no values at tool-turn tokens
        values = micro_batch_values(self.model, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                    mb["responses"].shape[1], packed=self.cfg.actor.use_packing)
        return values * mb_mask

    def _micro_batches(self, batch: Batch) -> List[List[int]]:
        """Row groups, one per forward: the actor's row count or the critic's token budget (the same number of
        groups on every rank: each forward is an FSDP collective)."""
        a = self.cfg.actor
        budget = self.cfg.critic.max_tokens_per_micro_batch or a.max_tokens_per_micro_batch
        return micro_batch_groups(batch["attention_mask"], batch["responses"].shape[1],
                                  self.batch_plan.micro_batch_rows, budget, a.use_packing,
                                  lambda count: all_reduce_max(count, self.device))

    @dispatch(SPLIT_BATCH)
    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        """``values`` [b, T]: V(prefix before response token t), 0 at padding."""
        self.model.eval()
        with self.offload.on_device():
            groups = self._micro_batches(batch)
            out = [self._values(batch.select(idx).to(self.device)).cpu() for idx in groups]
        return Batch({"values": restore_order(out, groups)})

    # ------------------------------------------------------------------ update
    @dispatch(SPLIT_METRICS)
    def update_critic(self, batch: Batch) -> Dict[str, float]:
        """Clipped value loss toward ``returns`` (old values: ``values``), ``actor.ppo_epochs`` passes over the same
        mini-batches as the actor. The loss is a token mean over all ranks' valid tokens of a mini-batch, so the
        gradient does not depend on how rows are split across ranks and micro-batches."""
        with self.offload.on_device(optimizer=True):
            metrics = self._update_critic(batch)
            self.optimizer.zero_grad(set_to_none=True)  # not needed after the step: free them (or skip moving them)
        return metrics

    def _update_critic(self, batch: Batch) -> Dict[str, float]:
        c = self.cfg.critic
        for key in ("values", "returns", "response_mask"):
            if key not in batch:
                raise KeyError(f"update_critic needs '{key}' in the batch")
        self.model.train()

        def micro_loss(mb: Batch, mask: torch.Tensor):
            loss, vl_metrics = value_loss(self._values(mb), mb["values"], mb["returns"], mask, c.cliprange_value,
                                          "token-mean")
            return loss, [("critic/value_loss", loss.item()), *vl_metrics.items()]

        # The actor's update loop with the value loss: a token mean over all ranks' valid tokens of a mini-batch.
        sums, steps = run_update(self.model, self.optimizer, batch,
                                 num_minis=self.batch_plan.mini_batches_for(len(batch)),
                                 epochs=self.batch_plan.ppo_epochs, micro_batches=self._micro_batches,
                                 micro_loss=micro_loss, denominator=lambda m: float(m.sum().item()),
                                 device=self.device, world_size=self.world_size, grad_clip=self.cfg.actor.grad_clip,
                                 prefix="critic")
        metrics = sums.means()
        if steps["skipped"]:
            metrics["critic/skipped_steps"] = 1.0
        mask = loss_mask(batch)
        metrics["critic/explained_variance"] = explained_variance(batch["values"], batch["returns"], mask)
        metrics["critic/returns_mean"] = float(masked_mean(batch["returns"], mask))
        metrics["critic/values_mean"] = float(masked_mean(batch["values"], mask))
        metrics["critic/lr"] = self.optimizer.param_groups[0]["lr"]
        return metrics

    # ------------------------------------------------------------------ checkpoints
    @dispatch(ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        """Write ``<directory>/critic/``: the value model (HF backbone + head) and ``critic_optim.pt``."""
        target = Path(directory) / CHECKPOINT_SUBDIR
        with self.offload.on_device(optimizer=True):  # the state-dict gather is a device collective
            model_sd, optim_sd = full_state_dict(self.model, self.optimizer)
        if self.rank == 0:
            self.model.save_pretrained(str(target), state_dict=model_sd)
            torch.save({"optimizer": optim_sd}, target / "critic_optim.pt")
        dist.barrier()

    @dispatch(ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        """Restore the value model and optimizer from ``<directory>/critic/``."""
        source = Path(directory) / CHECKPOINT_SUBDIR
        if not source.is_dir():
            raise FileNotFoundError(f"{directory} has no {CHECKPOINT_SUBDIR}/ folder: not a PPO (critic) checkpoint")
        model_sd = load_value_state_dict(str(source))
        state = torch.load(source / "critic_optim.pt", weights_only=False)
        with self.offload.on_device(optimizer=True):
            if hasattr(self.model, "reshard"):  # a forward leaves the FSDP root unsharded (plain tensors, not DTensors)
                self.model.reshard()
            load_full_state_dict(self.model, self.optimizer, model_sd, state["optimizer"])

    @dispatch(ONE_TO_ALL)
    def pop_offload_timing(self) -> Dict[str, float]:
        """``timing_s/offload_critic`` and ``timing_s/onload_critic`` since the last call (empty with offload off)."""
        return self.offload.pop_metrics()

    @dispatch(ONE_TO_ALL)
    def info(self) -> Dict[str, Any]:
        return {"rank": self.rank, "device": self.device, "pid": os.getpid(), "threads": torch.get_num_threads()}
