"""ActorRolloutRef: one data-parallel rank of the hybrid engine.

It holds the FSDP2-sharded actor (with its optimizer), the rollout engine colocated in the same process, and the
reference policy. All phase switching lives here, each phase a method the trainer calls: ``sleep_engine`` before
training, ``sync_weights`` after an update (wakes the engine's weights, loads the new ones, wakes its KV cache), or
``wake_engine`` when a step skips the update. ``generate`` never wakes the engine: the engine owns its sleep state
(``asleep_parts``) and refuses to generate while asleep.

Offload (``actor.offload_params``, ``actor.offload_optimizer``, ``ref.offload_params``): a model lives in CPU memory
except inside the phases that use it: the actor's shards (and gradients) during old log-probs, the update and a
checkpoint; its optimizer state during the update and a checkpoint; the reference model's shards during ref log-probs.
Both are offloaded before the engine starts, so vLLM sizes its KV cache with their memory free. The weight sync does
not bring the whole actor back: it copies one shard at a time to the device and all-gathers it there.
"""
from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from reasonrl.config import from_dict
from reasonrl.config.batch_plan import BatchPlan
from reasonrl.data.batch import Batch
from reasonrl.data.micro_batches import micro_batch_groups, restore_order
from reasonrl.models import load_causal_lm, load_tokenizer, torch_dtype
from reasonrl.models.forward import micro_batch_log_probs, response_log_probs, training_temperature
from reasonrl.rollout import SLEEP_PARTS, make_rollout_engine, resolve_engine_name

from . import weight_transfer
from .dispatch import ONE_TO_ALL, RANK_ZERO, SPLIT_BATCH, SPLIT_BY_ENGINE, SPLIT_METRICS, dispatch
from .distributed import all_reduce_max, start_rank
from .fsdp import (Offloader, compile_decoder_layers, full_state_dict, iter_full_params,
                   load_full_state_dict, shard_model)
from .actor_update import PolicyUpdate
from .rollout_worker import generate_chunks, rollout_generator

log = logging.getLogger(__name__)


class ActorRolloutRefWorker(PolicyUpdate):
    def __init__(self, config: Dict[str, Any], model_path: str, rank: int, world_size: int, master_addr: str,
                 master_port: int, num_threads: int = 0, batch_plan: Optional[BatchPlan] = None) -> None:
        self.cfg = from_dict(config)
        if self.cfg.rollout.tensor_parallel_size > 1 and resolve_engine_name(self.cfg.rollout.engine) != "vllm":
            raise ValueError(f"rollout.tensor_parallel_size={self.cfg.rollout.tensor_parallel_size} needs "
                             f"rollout.engine=vllm (the {self.cfg.rollout.engine} engine is not sharded)")
        self.rank, self.world_size = rank, world_size
        # The trainer's plan (mini-/micro-batch sizes); built from the same config when the worker stands alone.
        self.batch_plan = batch_plan or BatchPlan.from_config(self.cfg, world_size)
        self.device, self.mesh = start_rank(self.cfg.trainer.device, self.cfg.trainer.seed, rank, world_size,
                                            master_addr, master_port, num_threads)
        self.model_path = model_path
        self.tokenizer = load_tokenizer(model_path, self.cfg.model.trust_remote_code)
        self.compute_dtype = torch_dtype(self.cfg.model.dtype, self.device)

        self.actor = load_causal_lm(model_path, torch.float32, self.cfg.model.trust_remote_code,
                                    self.cfg.model.attn_implementation)
        if self.cfg.model.gradient_checkpointing:
            self.actor.gradient_checkpointing_enable()
        self.actor.config.use_cache = False
        if self.cfg.actor.compile:
            compile_decoder_layers(self.actor)
        shard_model(self.actor, self.mesh, self.device, self.compute_dtype)
        a = self.cfg.actor
        self.optimizer = torch.optim.AdamW(self.actor.parameters(), lr=a.lr, betas=tuple(a.betas),
                                           weight_decay=a.weight_decay)
        warmup = max(0, a.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)

        self.ref = None
        if self.cfg.algorithm.use_kl_loss or self.cfg.algorithm.kl_in_reward:
            self.ref = load_causal_lm(model_path, torch.float32, self.cfg.model.trust_remote_code,
                                      self.cfg.model.attn_implementation)
            self.ref.requires_grad_(False)
            shard_model(self.ref, self.mesh, self.device, self.compute_dtype)
            self.ref.eval()
        self.actor_offload = Offloader("actor", self.actor, self.device, a.offload_params, self.optimizer,
                                       a.offload_optimizer)
        self.ref_offload = Offloader("ref", self.ref, self.device, self.cfg.ref.offload_params and self.ref is not None)
        self.actor_offload.offload()  # before the engine starts: it sizes its KV cache by the free memory
        self.ref_offload.offload()

        max_len = self.cfg.data.max_prompt_length + max(self.cfg.rollout.max_new_tokens, self.cfg.eval.max_new_tokens)
        self.engine = None  # trainer.mode=async: no engine here, the RolloutWorkers generate on their own devices
        self.engine_start_s: Optional[float] = None  # the trainer's startup_s/engine_start
        if self.cfg.trainer.mode != "async":
            started = time.perf_counter()
            self.engine = make_rollout_engine(self.cfg.rollout, model_path, self.tokenizer, self.compute_dtype,
                                              self.device, max_len)
            self.engine_start_s = time.perf_counter() - started
        self.tool_rollout = None  # the multi-turn loop around the engine (tool.enabled), built on first use
        self.transfer_store = self.transfer_group = None  # async: actor rank 0's end of the weight transfer

    # ------------------------------------------------------------------ rollout
    @dispatch(SPLIT_BY_ENGINE)
    def generate(self, prompts: Batch, sampling: Dict[str, Any]) -> Batch:
        """Sample ``n`` responses for each prompt row (meta ``prompt_ids``); returns one row per response, grouped
        by prompt, with meta ``prompt_ids``, ``response_ids``, ``rollout_log_probs``, ``response_text``,
        ``finish_reason`` and ``prompt_row`` (the prompt's position in this call). With tensor-parallel rollouts
        every rank of an engine gets the same prompts (they run the engine together)."""
        self._need_engine()
        return next(generate_chunks(self._generator(), prompts["prompt_ids"], sampling, 0, self.cfg.tool.enabled))

    def generate_stream(self, prompts: Batch, sampling: Dict[str, Any], chunk_prompts: int) -> Iterator[Batch]:
        """A Ray streaming generator (``WorkerGroup.stream``): the rows of ``generate``, ``chunk_prompts`` prompts'
        responses at a time, so the verifier pool can start on them while the rest are generated."""
        self._need_engine()
        yield from generate_chunks(self._generator(), prompts["prompt_ids"], sampling, chunk_prompts,
                                   self.cfg.tool.enabled)

    def _need_engine(self) -> None:
        if self.engine is None:
            raise RuntimeError("this actor worker has no rollout engine (trainer.mode=async): the RolloutWorkers "
                               "generate")

    def _generator(self):
        """The engine, or the multi-turn tool loop around it when ``tool.enabled`` (``rollout/multiturn.py``)."""
        if not self.cfg.tool.enabled:
            return self.engine
        if self.tool_rollout is None:
            self.tool_rollout = rollout_generator(self.engine, self.tokenizer, self.cfg)
        return self.tool_rollout

    @dispatch(ONE_TO_ALL)
    def sleep_engine(self) -> float:
        """Free the engine's weights and KV cache while the actor trains (vLLM on GPU with
        ``rollout.free_cache_engine``; elsewhere a no-op: ``supports_sleep`` is False). Seconds taken."""
        start = time.perf_counter()
        if self.engine is None:  # async: the RolloutWorkers hold the engines
            return 0.0
        if self.engine.supports_sleep and self.cfg.rollout.free_cache_engine and not self.engine.asleep_parts:
            self.engine.sleep()
        return time.perf_counter() - start

    @dispatch(ONE_TO_ALL)
    def wake_engine(self) -> float:
        """Bring back all the engine freed without new weights (a step whose actor update is skipped). After an
        update ``sync_weights`` wakes it instead. Seconds taken."""
        start = time.perf_counter()
        self._wake_engine(SLEEP_PARTS)
        return time.perf_counter() - start

    def _wake_engine(self, parts) -> None:
        if self.engine is None:
            return
        parts = [p for p in parts if p in self.engine.asleep_parts]
        if not parts:
            return
        if self.device == "cuda":  # hand the update's cached blocks back before vLLM re-maps its memory
            torch.cuda.empty_cache()
        self.engine.wake_up(parts)

    # ------------------------------------------------------------------ log-probs
    def _micro_batches(self, batch: Batch, max_tokens: int) -> List[List[int]]:
        """Row groups of ``batch``, one per forward (fixed row counts, or a token budget: the same count on every
        rank, since each forward is an FSDP collective)."""
        return micro_batch_groups(batch["attention_mask"], batch["responses"].shape[1],
                                  self.batch_plan.micro_batch_rows, max_tokens, self.cfg.actor.use_packing,
                                  lambda count: all_reduce_max(count, self.device))

    def _mb_log_probs(self, model, mb: Batch, with_entropy: bool):
        """Log-probs (and entropy) of one micro-batch at the rollout's sampling temperature (greedy: 1), the
        distribution the responses were drawn from: the old, actor and reference log-probs all come from here."""
        return micro_batch_log_probs(model, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                     mb["responses"], with_entropy, packed=self.cfg.actor.use_packing,
                                     temperature=training_temperature(self.cfg.rollout.temperature))

    def _forward_batches(self, model, batch: Batch, with_entropy: bool, max_tokens: int):
        groups = self._micro_batches(batch, max_tokens)
        out_lp, out_ent = [], []
        for idx in groups:
            lp, ent = self._mb_log_probs(model, batch.select(idx).to(self.device), with_entropy)
            out_lp.append(lp.cpu())
            if ent is not None:
                out_ent.append(ent.cpu())
        return restore_order(out_lp, groups), (restore_order(out_ent, groups) if out_ent else None)

    @dispatch(SPLIT_BATCH)
    @torch.no_grad()
    def compute_log_probs(self, batch: Batch) -> Batch:
        """The actor's log-probs of the responses (``old_log_probs``) and the entropy at each response token, at the
        rollout temperature (``_mb_log_probs``)."""
        self.actor.eval()
        with self.actor_offload.on_device():
            lp, ent = self._forward_batches(self.actor, batch, True, self.cfg.actor.max_tokens_per_micro_batch)
        return Batch({"old_log_probs": lp, "entropy": ent})

    @dispatch(SPLIT_BATCH)
    @torch.no_grad()
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """The reference policy's log-probs of the responses (``ref_log_probs``), at the rollout temperature like
        the actor's, so the KL compares the two at the same temperature."""
        if self.ref is None:
            raise RuntimeError("no reference policy: algorithm.use_kl_loss and kl_in_reward are both off")
        with self.ref_offload.on_device():
            lp, _ = self._forward_batches(self.ref, batch, False, self.cfg.ref.max_tokens_per_micro_batch
                                          or self.cfg.actor.max_tokens_per_micro_batch)
        return Batch({"ref_log_probs": lp})

    # ------------------------------------------------------------------ update
    @dispatch(SPLIT_METRICS)
    def update_actor(self, batch: Batch, kl_coef: Optional[float] = None) -> Dict[str, float]:
        """PPO-style update over this rank's share: ``ppo_epochs`` passes over mini-batches, each accumulated over
        micro-batches; the loss is normalised by global (all-rank) token or sequence counts so that any split of the
        batch across ranks and micro-batches gives the same gradient. ``kl_coef``: the KL loss weight this step (the
        trainer's KL controller; None: ``algorithm.kl_coef``)."""
        with self.actor_offload.on_device(optimizer=True):
            metrics = self._update_actor(batch, self.cfg.algorithm.kl_coef if kl_coef is None else kl_coef)
            self.optimizer.zero_grad(set_to_none=True)  # not needed after the step: free them (or skip moving them)
        return metrics

    # ------------------------------------------------------------------ weight sync
    @dispatch(ONE_TO_ALL)
    def sync_weights(self) -> Dict[str, float]:
        """Stream the actor's parameters as full tensors, in buckets, into the colocated engine; a sleeping engine
        is woken on the way (weights, then the KV cache), so it is ready to generate afterwards."""
        from reasonrl.rollout.weight_sync import iter_buckets

        start = time.perf_counter()
        if self.engine is None:  # async: the weights go out through send_weights
            return {"seconds": 0.0, "bytes": 0.0}
        self._wake_engine(("weights",))  # the weights first: the KV cache takes its memory after the update
        bucket_bytes = self.cfg.rollout.weight_sync_bucket_mb * 2**20
        dtype = self.compute_dtype
        moved = 0

        # An offloaded actor is gathered from the CPU shard by shard: the whole model never comes back for the sync.
        for bucket in iter_buckets(iter_full_params(self.actor, self.device, dtype), bucket_bytes):
            self.engine.update_weights(bucket)
            moved += sum(t.numel() * t.element_size() for _, t in bucket)
        self.engine.finish_weight_update()  # vLLM on CPU: closes the layerwise reload session (repacks layers)
        self._wake_engine(("kv_cache",))
        return {"seconds": time.perf_counter() - start, "bytes": float(moved)}

    @dispatch(RANK_ZERO)
    @torch.no_grad()
    def check_weight_sync(self, prompt_ids: List[int], response_ids: List[int]) -> Dict[str, float]:
        """Debug: the engine's log-probs of a fixed sequence against the actor's (max/mean abs difference).
        Every rank runs it (the actor's forward is an FSDP collective); rank 0's numbers are reported. Both sides
        are at temperature 1, whatever ``rollout.temperature``: the engine scores the sequence as a prompt, and vLLM
        applies no sampling processing (temperature, top-p/top-k) to prompt log-probs; a weight mismatch shows at
        any temperature."""
        from reasonrl.rollout.weight_sync import logprob_diff

        engine_lp = self.engine.sequence_logprobs([list(prompt_ids)], [list(response_ids)])[0]
        ids = torch.tensor([list(prompt_ids) + list(response_ids)], device=self.device)
        pos = torch.arange(ids.shape[1], device=self.device)[None]
        self.actor.eval()
        with self.actor_offload.on_device():
            actor_lp, _ = response_log_probs(self.actor, ids, torch.ones_like(ids), pos,
                                             torch.tensor([list(response_ids)], device=self.device), temperature=1.0)
        return logprob_diff(engine_lp, actor_lp[0].cpu().tolist()).as_metrics()

    # ------------------------------------------------------------------ weight transfer (trainer.mode=async)
    @dispatch(RANK_ZERO)
    def open_weight_transfer(self) -> Tuple[str, int]:
        """Rank 0: host the transfer group's store; returns its (ip, port)."""
        if self.rank != 0:
            return "", 0
        self.transfer_store, host, port = weight_transfer.open_store()
        return host, port

    @dispatch(ONE_TO_ALL)
    def join_weight_transfer(self, group_size: int) -> None:
        """Rank 0 joins the transfer group as its rank 0 (the rollout workers join at the same time)."""
        if self.rank == 0:
            self.transfer_group = weight_transfer.join_group(self.transfer_store, 0, group_size, self.device,
                                                             self.cfg.async_rollout.transfer_timeout_s)

    @dispatch(RANK_ZERO)
    def weight_specs(self) -> List[weight_transfer.ParamSpec]:
        """What ``send_weights`` sends: every parameter's name, full shape and dtype."""
        return weight_transfer.param_specs(self.actor.named_parameters(), self.compute_dtype)

    @dispatch(ONE_TO_ALL)
    def send_weights(self, specs: List[weight_transfer.ParamSpec]) -> Dict[str, float]:
        """Gather the full parameters (every rank: an FSDP collective) and broadcast them from rank 0, in buckets."""
        start = time.perf_counter()
        params = iter_full_params(self.actor, self.device, self.compute_dtype)
        if self.rank != 0:
            for _ in params:
                pass
            return {"seconds": time.perf_counter() - start, "bytes": 0.0}
        bucket_bytes = self.cfg.rollout.weight_sync_bucket_mb * 2**20
        sent = weight_transfer.send(self.transfer_group, params, specs, bucket_bytes)
        return {"seconds": time.perf_counter() - start, "bytes": float(sent)}

    # ------------------------------------------------------------------ checkpoints
    @dispatch(ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        """Write model (HF safetensors export, also used to resume), optimizer, scheduler and RNG states."""
        directory = Path(directory)
        with self.actor_offload.on_device(optimizer=True):  # the state-dict gather is a device collective
            model_sd, optim_sd = full_state_dict(self.actor, self.optimizer)
        if self.rank == 0:
            hf_dir = directory / "hf"
            unwrapped = self.actor
            unwrapped.save_pretrained(hf_dir, state_dict=model_sd, safe_serialization=True)
            self.tokenizer.save_pretrained(hf_dir)
            torch.save({"optimizer": optim_sd, "scheduler": self.scheduler.state_dict()},
                       directory / "actor_optim.pt")
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state() if self.device == "cuda" else None},
                   directory / f"rng_rank{self.rank}.pt")
        dist.barrier()

    @dispatch(ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        directory = Path(directory)
        from safetensors.torch import load_file

        model_sd = {}
        for f in sorted((directory / "hf").glob("*.safetensors")):
            model_sd.update(load_file(str(f)))
        state = torch.load(directory / "actor_optim.pt", weights_only=False)
        with self.actor_offload.on_device(optimizer=True):
            self.actor.reshard()  # after a forward the FSDP root may hold unsharded tensors; loading needs the shards
            load_full_state_dict(self.actor, self.optimizer, model_sd, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        rng_file = directory / f"rng_rank{self.rank}.pt"
        if rng_file.exists():
            rng = torch.load(rng_file, weights_only=False)
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            if rng.get("cuda") is not None and self.device == "cuda":
                torch.cuda.set_rng_state(rng["cuda"])

    @dispatch(ONE_TO_ALL)
    def pop_offload_timing(self) -> Dict[str, float]:
        """Seconds spent moving the actor (params, gradients, optimizer state) and the reference model between the
        device and the CPU since the last call: ``timing_s/{offload,onload}_{actor,ref}`` (empty with offload off)."""
        return {**self.actor_offload.pop_metrics(), **self.ref_offload.pop_metrics()}

    @dispatch(ONE_TO_ALL)
    def info(self) -> Dict[str, Any]:
        import ray

        return {"rank": self.rank, "device": self.device, "engine": self.engine.name if self.engine else "none",
                "pid": os.getpid(), "threads": torch.get_num_threads(),
                "engine_can_sleep": bool(self.engine and self.engine.supports_sleep),
                "engine_start_s": self.engine_start_s,
                "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
                "node_ip": ray.util.get_node_ip_address() if ray.is_initialized() else None,
                "engine_ranks": self.cfg.rollout.tensor_parallel_size}
