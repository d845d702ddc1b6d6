"""The Policy core: one FSDP2-sharded causal LM in this process (no Ray), its log-probs over a Batch, and, when it has
an optimizer, its PPO-style update (``actor_update.policy_update`` over the shared ``update_loop``).

The actor is a Policy with an optimizer and a scheduler; the reference policy is the same class without them (and,
with LoRA, the actor's own model with its adapters disabled: ``adapters_off``). Every teacher-forced pass (old, actor
and reference log-probs) goes through ``mb_log_probs``: at the rollout's sampling temperature (greedy: 1), the
distribution the responses were drawn from. The actor's part of a checkpoint (its weights, optimizer and scheduler,
and the rank's random state) is written and read here (``save``, ``load``).
"""
from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import torch

from reasonrl.config.batch_plan import BatchPlan
from reasonrl.data.batch import Batch
from reasonrl.data.micro_batches import micro_batch_groups, restore_order
from reasonrl.models import load_causal_lm
from reasonrl.models.forward import micro_batch_log_probs, response_log_probs, training_temperature

from .distributed import all_reduce_max
from .fsdp import (Offloader, compile_decoder_layers, fix_gradient_dtypes, full_state_dict, load_full_state_dict,
                   shard_model)
from .optim import build_adamw


def reference_param_dtype(cfg, compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the reference's shards (``ref.param_dtype``): auto, the compute dtype (a frozen model gains
    nothing from fp32 shards: FSDP casts them to the compute dtype before every forward, the same rounding the load
    makes); float32 as the actor."""
    return compute_dtype if cfg.ref.param_dtype == "auto" else torch.float32


def load_sharded_lm(cfg, model_path: str, mesh, device: str, compute_dtype: torch.dtype, trainable: bool,
                    prepare: Optional[Callable[[torch.nn.Module], torch.nn.Module]] = None,
                    param_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The causal LM at ``model_path`` with ``param_dtype`` shards (fp32 for a trained model), FSDP2-sharded over
    ``mesh`` (compute in ``compute_dtype``).
    ``trainable``: gradient checkpointing (``model.gradient_checkpointing``) and ``actor.compile`` apply; otherwise
    the model is frozen and in eval mode. ``prepare`` runs on the loaded model before it is compiled and sharded
    (LoRA wraps it there) and returns the model to shard."""
    model = load_causal_lm(model_path, param_dtype, cfg.model.trust_remote_code, cfg.model.attn_implementation,
                           device)
    if trainable and cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    if prepare is not None:
        model = prepare(model)
    if trainable and cfg.actor.compile:
        compile_decoder_layers(model)
    if not trainable:
        model.requires_grad_(False)
    shard_model(model, mesh, device, compute_dtype)
    if not trainable:
        model.eval()
    elif compute_dtype != torch.float32 and not all(p.requires_grad for p in model.parameters()):
        fix_gradient_dtypes(model, device)  # LoRA under mixed precision: before any pass turns the adapters off
    return model


def mb_log_probs(cfg, model, mb: Batch, with_entropy: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs (and entropy) of one micro-batch on the device at the rollout's sampling temperature (greedy: 1)."""
    return micro_batch_log_probs(model, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                 mb["responses"], with_entropy, packed=cfg.actor.use_packing,
                                 temperature=training_temperature(cfg.rollout.temperature))


class Policy:
    """A causal LM on this rank and what runs through it (see the module docstring).

    ``name``: "actor" or "ref" (offload metrics, messages); ``offload``: where the model (and optimizer) lives between
    phases; ``max_tokens``: the token budget of a micro-batch (0: ``batch_plan.micro_batch_rows`` rows);
    ``adapters_off``: run every forward with the model's LoRA adapters disabled (the reference of a LoRA actor)."""

    def __init__(self, name: str, model: torch.nn.Module, cfg, batch_plan: BatchPlan, device: str, world_size: int,
                 offload: Offloader, max_tokens: int = 0, optimizer: Optional[torch.optim.Optimizer] = None,
                 scheduler=None, adapters_off: bool = False) -> None:
        self.name, self.model, self.cfg, self.batch_plan = name, model, cfg, batch_plan
        self.device, self.world_size, self.offload, self.max_tokens = device, world_size, offload, max_tokens
        self.optimizer, self.scheduler, self.adapters_off = optimizer, scheduler, adapters_off

    @classmethod
    def actor(cls, model: torch.nn.Module, cfg, batch_plan: BatchPlan, device: str, world_size: int,
              trainable_params=None) -> "Policy":
        """The actor: AdamW (``optim.build_adamw``) over ``trainable_params`` (default: all the model's parameters;
        LoRA: the adapters'), a linear warm-up of ``actor.warmup_steps`` then constant, and the actor's offload
        settings."""
        a = cfg.actor
        params = list(trainable_params if trainable_params is not None else model.parameters())
        optimizer = build_adamw(params, cfg, a.lr, device)
        warmup = max(0, a.warmup_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        offload = Offloader("actor", model, device, a.offload_params, optimizer, a.offload_optimizer)
        return cls("actor", model, cfg, batch_plan, device, world_size, offload, a.max_tokens_per_micro_batch,
                   optimizer, scheduler)

    @classmethod
    def reference(cls, model: Optional[torch.nn.Module], cfg, batch_plan: BatchPlan, device: str, world_size: int,
                  shared_offload: Optional[Offloader] = None) -> "Policy":
        """The reference: no optimizer; its own offload setting (``ref.offload_params``). ``shared_offload``: the
        actor's offloader, when the reference is the actor's own LoRA model with its adapters disabled (one copy)."""
        adapters_off = shared_offload is not None
        offload = shared_offload or Offloader("ref", model, device, cfg.ref.offload_params)
        budget = cfg.ref.max_tokens_per_micro_batch or cfg.actor.max_tokens_per_micro_batch
        return cls("ref", model, cfg, batch_plan, device, world_size, offload, budget, adapters_off=adapters_off)

    # ------------------------------------------------------------------ forward passes
    def forward_context(self):
        """Inside: the model as this policy sees it (adapters disabled for the reference of a LoRA actor)."""
        if self.adapters_off:
            return self.model.disable_adapter()
        return contextlib.nullcontext()

    def micro_batches(self, batch: Batch, max_tokens: Optional[int] = None) -> List[List[int]]:
        """Row groups of ``batch``, one per forward (fixed row counts, or a token budget: the same count on every
        rank, since each forward is an FSDP collective)."""
        return micro_batch_groups(batch["attention_mask"], batch["responses"].shape[1],
                                  self.batch_plan.micro_batch_rows,
                                  self.max_tokens if max_tokens is None else max_tokens, self.cfg.actor.use_packing,
                                  lambda count: all_reduce_max(count, self.device))

    def mb_log_probs(self, mb: Batch, with_entropy: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Log-probs (and entropy) of one micro-batch already on the device (``mb_log_probs``)."""
        with self.forward_context():
            return mb_log_probs(self.cfg, self.model, mb, with_entropy)

    @torch.no_grad()
    def log_probs(self, batch: Batch, with_entropy: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Log-probs [rows, T] (and entropy) of ``batch``'s responses, in its row order, computed micro-batch by
        micro-batch with the model on the device for the call."""
        self.model.eval()
        with self.offload.on_device():
            groups = self.micro_batches(batch)
            out_lp, out_ent = [], []
            for idx in groups:
                lp, ent = self.mb_log_probs(batch.select(idx).to(self.device), with_entropy)
                out_lp.append(lp.cpu())
                if ent is not None:
                    out_ent.append(ent.cpu())
        return restore_order(out_lp, groups), (restore_order(out_ent, groups) if out_ent else None)

    @torch.no_grad()
    def sequence_log_probs(self, prompt_ids: List[int], response_ids: List[int]) -> List[float]:
        """Log-probs at temperature 1 of ``response_ids`` after ``prompt_ids`` (one row, no padding): the policy
        side of the weight-sync check."""
        ids = torch.tensor([list(prompt_ids) + list(response_ids)], device=self.device)
        pos = torch.arange(ids.shape[1], device=self.device)[None]
        self.model.eval()
        with self.offload.on_device(), self.forward_context():
            lp, _ = response_log_probs(self.model, ids, torch.ones_like(ids), pos,
                                       torch.tensor([list(response_ids)], device=self.device), temperature=1.0)
        return lp[0].cpu().tolist()

    # ------------------------------------------------------------------ update
    def update(self, batch: Batch, kl_coef: float):
        """The policy update over this rank's share (``actor_update.policy_update``); needs an optimizer."""
        from .actor_update import policy_update

        if self.optimizer is None:
            raise RuntimeError(f"the {self.name} policy has no optimizer: it does not train")
        with self.offload.on_device(optimizer=True):
            metrics = policy_update(self, batch, kl_coef)
            self.optimizer.zero_grad(set_to_none=True)  # not needed after the step: free them (or skip moving them)
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: Path, rank: int, tokenizer, lora) -> None:
        """Every rank (the state-dict gather is a collective): rank 0 writes ``hf/`` (the HF safetensors export, also
        what a resume loads; with LoRA (``lora_sync.LoraSync``) ``adapter/`` too, ``hf/`` then the merged model) and
        ``actor_optim.pt`` (optimizer, scheduler); each rank its random state, ``rng_rank<rank>.pt``."""
        with self.offload.on_device(optimizer=True):
            model_sd, optim_sd = full_state_dict(self.model, self.optimizer)
        if rank == 0:
            unwrapped = self.model
            if lora.on:
                model_sd = lora.export(directory, model_sd, tokenizer)
                unwrapped = self.model.get_base_model()
            unwrapped.save_pretrained(directory / "hf", state_dict=model_sd, safe_serialization=True)
            tokenizer.save_pretrained(directory / "hf")
            torch.save({"optimizer": optim_sd, "scheduler": self.scheduler.state_dict()}, directory / "actor_optim.pt")
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state() if self.device == "cuda" else None},
                   directory / f"rng_rank{rank}.pt")

    def load(self, directory: Path, rank: int, lora) -> None:
        """What ``save`` wrote: the weights (LoRA: the adapter; the frozen base is the base model's, as at the start),
        the optimizer and scheduler, and this rank's random state (when the checkpoint has it)."""
        from safetensors.torch import load_file

        model_sd = lora.adapter_state(directory, self.model) if lora.on else {}
        for f in sorted((directory / "hf").glob("*.safetensors")) if not lora.on else []:
            model_sd.update(load_file(str(f)))
        state = torch.load(directory / "actor_optim.pt", weights_only=False)
        with self.offload.on_device(optimizer=True):
            self.model.reshard()  # after a forward the FSDP root may hold unsharded tensors; loading needs the shards
            load_full_state_dict(self.model, self.optimizer, model_sd, state["optimizer"], strict=not lora.on)
        self.scheduler.load_state_dict(state["scheduler"])
        rng_file = directory / f"rng_rank{rank}.pt"
        if rng_file.exists():
            rng = torch.load(rng_file, weights_only=False)
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            if rng.get("cuda") is not None and self.device == "cuda":
                torch.cuda.set_rng_state(rng["cuda"])
