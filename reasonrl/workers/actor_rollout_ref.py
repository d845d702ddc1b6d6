"""ActorRolloutRef: one data-parallel rank of the hybrid engine.

It holds the FSDP2-sharded actor (with its optimizer), the rollout engine colocated in the same process, and the
reference policy. All phase switching lives here: wake the engine before rollout, sleep it around training, stream
the new weights into the engine after each update.

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
from typing import Any, Dict, Iterator, List, Tuple

import torch
import torch.distributed as dist

from reasonrl.algorithms import aggregate_loss, kl_penalty, policy_loss, tis_weights
from reasonrl.config import from_dict
from reasonrl.data.batch import Batch
from reasonrl.models import load_causal_lm, load_tokenizer, torch_dtype
from reasonrl.models.forward import response_log_probs
from reasonrl.rollout import make_rollout_engine

from . import weight_transfer
from .dispatch import ONE_TO_ALL, RANK_ZERO, SPLIT_BATCH, SPLIT_METRICS, dispatch
from .distributed import all_reduce_sum, start_rank
from .fsdp import (Offloader, clip_grad_norm, compile_decoder_layers, full_state_dict, iter_full_params,
                   load_full_state_dict, shard_model)
from .rollout_worker import generate_chunks

log = logging.getLogger(__name__)


class ActorRolloutRefWorker:
    def __init__(self, config: Dict[str, Any], model_path: str, rank: int, world_size: int, master_addr: str,
                 master_port: int, num_threads: int = 0) -> None:
        self.cfg = from_dict(config)
        self.rank, self.world_size = rank, world_size
        self.device, self.mesh = start_rank(self.cfg.trainer.device, self.cfg.trainer.seed, rank, world_size,
                                            master_addr, master_port, num_threads)
        self.model_path = model_path
        self.tokenizer = load_tokenizer(model_path, self.cfg.model.trust_remote_code)
        self.compute_dtype = torch_dtype(self.cfg.model.dtype, self.device)

        self.actor = load_causal_lm(model_path, torch.float32, self.cfg.model.trust_remote_code)
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
            self.ref = load_causal_lm(model_path, torch.float32, self.cfg.model.trust_remote_code)
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
        if self.cfg.trainer.mode != "async":
            self.engine = make_rollout_engine(self.cfg.rollout, model_path, self.tokenizer, self.compute_dtype,
                                              self.device, max_len)
        self.transfer_store = self.transfer_group = None  # async: actor rank 0's end of the weight transfer
        self.engine_asleep: set = set()  # parts of the engine's memory freed by sleep_engine

    # ------------------------------------------------------------------ rollout
    @dispatch(SPLIT_BATCH)
    def generate(self, prompts: Batch, sampling: Dict[str, Any]) -> Batch:
        """Sample ``n`` responses for each prompt row (meta ``prompt_ids``); returns one row per response, grouped
        by prompt, with meta ``prompt_ids``, ``response_ids``, ``rollout_log_probs``, ``response_text``,
        ``finish_reason`` and ``prompt_row`` (the prompt's position in this call)."""
        self._need_engine()
        self._wake_engine()
        return next(generate_chunks(self.engine, prompts["prompt_ids"], sampling, 0))

    def generate_stream(self, prompts: Batch, sampling: Dict[str, Any], chunk_prompts: int) -> Iterator[Batch]:
        """A Ray streaming generator (``WorkerGroup.stream``): the rows of ``generate``, ``chunk_prompts`` prompts'
        responses at a time, so the verifier pool can start on them while the rest are generated."""
        self._need_engine()
        self._wake_engine()
        yield from generate_chunks(self.engine, prompts["prompt_ids"], sampling, chunk_prompts)

    def _need_engine(self) -> None:
        if self.engine is None:
            raise RuntimeError("this actor worker has no rollout engine (trainer.mode=async): the RolloutWorkers "
                               "generate")

    def _wake_engine(self, parts=("weights", "kv_cache")) -> None:
        """Re-allocate what ``sleep_engine`` freed: weights before a sync, then the KV cache before rollout."""
        parts = [p for p in parts if p in self.engine_asleep]
        if not parts:
            return
        if self.device == "cuda":  # hand the update's cached blocks back before vLLM re-maps its memory
            torch.cuda.empty_cache()
        self.engine.wake_up(parts)
        self.engine_asleep.difference_update(parts)

    @dispatch(ONE_TO_ALL)
    def sleep_engine(self) -> float:
        """Free the engine's weights and KV cache while the actor trains (vLLM on GPU). On CPU vLLM has no sleep
        mode, so the engine keeps its memory and this is a no-op (``supports_sleep`` is False)."""
        start = time.perf_counter()
        if self.engine is None:
            return 0.0
        if self.engine.supports_sleep and self.cfg.rollout.free_cache_engine and not self.engine_asleep:
            self.engine.sleep()
            self.engine_asleep = {"weights", "kv_cache"}
        return time.perf_counter() - start

    # ------------------------------------------------------------------ log-probs
    def _forward_batches(self, model, batch: Batch, with_entropy: bool):
        size = self.cfg.actor.micro_batch_size_per_worker
        out_lp, out_ent = [], []
        for mb in batch.split(size):
            mb = mb.to(self.device)
            lp, ent = response_log_probs(model, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                         mb["responses"], with_entropy)
            out_lp.append(lp.cpu())
            if ent is not None:
                out_ent.append(ent.cpu())
        return torch.cat(out_lp), (torch.cat(out_ent) if out_ent else None)

    @dispatch(SPLIT_BATCH)
    @torch.no_grad()
    def compute_log_probs(self, batch: Batch) -> Batch:
        """The actor's log-probs of the responses (``old_log_probs``) and the entropy at each response token."""
        self.actor.eval()
        with self.actor_offload.on_device():
            lp, ent = self._forward_batches(self.actor, batch, with_entropy=True)
        return Batch({"old_log_probs": lp, "entropy": ent})

    @dispatch(SPLIT_BATCH)
    @torch.no_grad()
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        if self.ref is None:
            raise RuntimeError("no reference policy: algorithm.use_kl_loss and kl_in_reward are both off")
        with self.ref_offload.on_device():
            lp, _ = self._forward_batches(self.ref, batch, with_entropy=False)
        return Batch({"ref_log_probs": lp})

    # ------------------------------------------------------------------ update
    @dispatch(SPLIT_METRICS)
    def update_actor(self, batch: Batch) -> Dict[str, float]:
        """PPO-style update over this rank's share: ``ppo_epochs`` passes over mini-batches, each accumulated over
        micro-batches; the loss is normalised by global (all-rank) token or sequence counts so that any split of the
        batch across ranks and micro-batches gives the same gradient."""
        with self.actor_offload.on_device(optimizer=True):
            metrics = self._update_actor(batch)
            self.optimizer.zero_grad(set_to_none=True)  # not needed after the step: free them (or skip moving them)
        return metrics

    def _update_actor(self, batch: Batch) -> Dict[str, float]:
        a, alg = self.cfg.actor, self.cfg.algorithm
        self.actor.train()
        n_mini = len(batch) * self.world_size // self._mini_batch_rows()
        minis = batch.chunk(max(1, n_mini))
        sums: Dict[str, float] = {}
        counts: Dict[str, int] = {}

        def add(key: str, value: float) -> None:
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1

        norm_length = self.cfg.rollout.max_new_tokens
        for _ in range(a.ppo_epochs):
            for mini in minis:
                if alg.loss_agg_mode == "token-mean":
                    global_denom = all_reduce_sum(mini["response_mask"].sum().item(), self.device)
                else:
                    global_denom = all_reduce_sum(len(mini), self.device)
                self.optimizer.zero_grad(set_to_none=True)
                for mb in mini.split(a.micro_batch_size_per_worker):
                    mb = mb.to(self.device)
                    mask = mb["response_mask"]
                    local_denom = mask.sum().item() if alg.loss_agg_mode == "token-mean" else len(mb)
                    weight = local_denom / max(global_denom, 1e-8) * self.world_size
                    need_entropy = alg.entropy_coef != 0
                    lp, ent = response_log_probs(self.actor, mb["input_ids"], mb["attention_mask"],
                                                 mb["position_ids"], mb["responses"], with_entropy=need_entropy)
                    is_w = None
                    if alg.tis_mode != "off":
                        is_w = tis_weights(mb["old_log_probs"], mb["rollout_log_probs"], mask, alg.tis_mode,
                                           alg.tis_cap)
                    pg, pg_metrics = policy_loss(alg.policy_loss, log_probs=lp, old_log_probs=mb["old_log_probs"],
                                                 advantages=mb["advantages"], mask=mask,
                                                 clip_low=alg.clip_ratio_low, clip_high=alg.clip_ratio_high,
                                                 clip_dual=alg.clip_ratio_dual, agg_mode=alg.loss_agg_mode,
                                                 norm_length=norm_length, is_weights=is_w)
                    loss = pg
                    if alg.use_kl_loss and "ref_log_probs" in mb:
                        kl = aggregate_loss(kl_penalty(lp, mb["ref_log_probs"], alg.kl_estimator), mask,
                                            alg.loss_agg_mode, norm_length)
                        loss = loss + alg.kl_coef * kl
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
                else:
                    log.warning("non-finite grad norm %s: skipping the optimizer step", grad_norm)
                    add("actor/skipped_steps", 1.0)
                self.scheduler.step()
                add("actor/grad_norm", grad_norm)
        metrics = {k: sums[k] / counts[k] for k in sums}
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _mini_batch_rows(self) -> int:
        prompts = self.cfg.actor.ppo_mini_batch_size or self.cfg.data.train_batch_size
        return prompts * self.cfg.rollout.n

    # ------------------------------------------------------------------ weight sync
    @dispatch(ONE_TO_ALL)
    def sync_weights(self) -> Dict[str, float]:
        """Stream the actor's parameters as full tensors, in buckets, into the colocated engine."""
        from reasonrl.rollout.weight_sync import iter_buckets

        start = time.perf_counter()
        if self.engine is None:  # async: the weights go out through send_weights
            return {"seconds": 0.0, "bytes": 0.0}
        self._wake_engine(("weights",))
        bucket_bytes = self.cfg.rollout.weight_sync_bucket_mb * 2**20
        dtype = self.compute_dtype
        moved = 0

        # An offloaded actor is gathered from the CPU shard by shard: the whole model never comes back for the sync.
        for bucket in iter_buckets(iter_full_params(self.actor, self.device, dtype), bucket_bytes):
            self.engine.update_weights(bucket)
            moved += sum(t.numel() * t.element_size() for _, t in bucket)
        finish = getattr(self.engine, "finish_weight_update", None)
        if finish is not None:  # vLLM on CPU: close the layerwise reload session (repacks the last layers)
            finish()
        self._wake_engine(("kv_cache",))
        return {"seconds": time.perf_counter() - start, "bytes": float(moved)}

    @dispatch(RANK_ZERO)
    @torch.no_grad()
    def check_weight_sync(self, prompt_ids: List[int], response_ids: List[int]) -> Dict[str, float]:
        """Debug: the engine's log-probs of a fixed sequence against the actor's (max/mean abs difference).
        Every rank runs it (the actor's forward is an FSDP collective); rank 0's numbers are reported."""
        from reasonrl.rollout.weight_sync import logprob_diff

        engine_lp = self.engine.sequence_logprobs([list(prompt_ids)], [list(response_ids)])[0]
        ids = torch.tensor([list(prompt_ids) + list(response_ids)], device=self.device)
        pos = torch.arange(ids.shape[1], device=self.device)[None]
        self.actor.eval()
        with self.actor_offload.on_device():
            actor_lp, _ = response_log_probs(self.actor, ids, torch.ones_like(ids), pos,
                                             torch.tensor([list(response_ids)], device=self.device))
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
        return {"rank": self.rank, "device": self.device, "engine": self.engine.name if self.engine else "none",
                "pid": os.getpid(), "threads": torch.get_num_threads(),
                "engine_can_sleep": bool(self.engine and self.engine.supports_sleep)}
