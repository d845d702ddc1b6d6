"""ActorRolloutRef: one data-parallel rank of the hybrid engine, the Ray-facing worker the trainer calls.

It composes the Policy core (``policy.py``): the actor (``policy``, a Policy with its optimizer, which also writes and
reads its checkpoint and this rank's random state) and the reference policy (``ref_policy``, the same class without
one; None without a KL term), and the engine host (``host``, ``engine_host.py``; None in async mode): the rollout
engine colocated in the same process. Tests and benchmarks reach the models, the optimizer and the engine through
these three. Each phase is a method the trainer calls: ``sleep_engine`` before training, ``sync_weights`` after an
update (wakes the engine's weights, loads the new ones, wakes its KV cache), or ``wake_engine`` when a step skips the
update. ``generate`` never wakes the engine: the engine owns its sleep state (``asleep_parts``) and refuses to generate
while asleep.

Offload (``actor.offload_params``, ``actor.offload_optimizer``, ``ref.offload_params``): a model lives in CPU memory
except inside the phases that use it: the actor's shards (and gradients) during old log-probs, the update and a
checkpoint; its optimizer state during the update and a checkpoint; the reference model's shards during ref log-probs.
Both are offloaded before the engine starts, so vLLM sizes its KV cache with their memory free. The weight sync does
not bring the whole actor back: it copies one shard at a time to the device and all-gathers it there.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from reasonrl.config import from_dict
from reasonrl.config.worker_plan import WorkerPlan
from reasonrl.data.batch import Batch
from reasonrl.data.sample import Sample
from reasonrl.models import load_tokenizer, torch_dtype
from reasonrl.rollout import SLEEP_PARTS

from . import weight_transfer
from .dispatch import ONE_TO_ALL, RANK_ZERO, SPLIT_BATCH, SPLIT_BY_ENGINE, SPLIT_METRICS, dispatch
from .distributed import start_rank
from .engine_host import EngineHost, make_engine
from .lora_sync import LoraSync
from .policy import Policy, load_sharded_lm, reference_param_dtype
from .host_memory import HostArena
from .published_weights import put, staged_bytes

log = logging.getLogger(__name__)


class ActorRolloutRefWorker:
    def __init__(self, config: Dict[str, Any], model_path: str, rank: int, world_size: int, master_addr: str,
                 master_port: int, num_threads: int = 0, *, plan: WorkerPlan) -> None:
        self.cfg = from_dict(config)
        self.rank, self.world_size = rank, world_size
        self.plan = plan  # the trainer's plan: batch sizes, device, engine or not, tools, the weight sync
        self.batch_plan = self.plan.batch
        self.device, self.mesh = start_rank(plan.device, self.cfg.trainer.seed, rank, world_size,
                                            master_addr, master_port, num_threads)
        self.model_path = model_path
        self.tokenizer = load_tokenizer(model_path, self.cfg.model.trust_remote_code)
        self.compute_dtype = torch_dtype(self.cfg.model.dtype, self.device)

        self.lora = LoraSync(self.cfg, model_path)  # actor.lora.rank 0: off, every call below as without it
        actor_model = load_sharded_lm(self.cfg, model_path, self.mesh, self.device, self.compute_dtype, True,
                                      self.lora.prepare)
        self.policy = Policy.actor(actor_model, self.cfg, self.batch_plan, self.device, world_size,
                                   self.lora.trainable(actor_model))
        self.ref_policy: Optional[Policy] = None
        if self.cfg.algorithm.use_kl_loss or self.cfg.algorithm.kl_in_reward:
            if self.lora.on:  # the reference for free: the actor's model with its adapters disabled
                self.ref_policy = Policy.reference(actor_model, self.cfg, self.batch_plan, self.device, world_size,
                                                   shared_offload=self.policy.offload)
            else:
                ref_model = load_sharded_lm(self.cfg, model_path, self.mesh, self.device, self.compute_dtype, False,
                                            param_dtype=reference_param_dtype(self.cfg, self.compute_dtype))
                self.ref_policy = Policy.reference(ref_model, self.cfg, self.batch_plan, self.device, world_size)
        for policy in self._policies():  # before the engine starts: it sizes its KV cache by the free memory
            policy.offload.offload()

        self.host: Optional[EngineHost] = None  # trainer.mode=async: no engine here, the RolloutWorkers generate
        if self.plan.hosts_engine:
            started = time.perf_counter()
            engine = make_engine(self.cfg, self.plan, model_path, self.tokenizer, self.compute_dtype, self.device,
                                 self.plan.engine_sleep_level)
            self.host = EngineHost(engine, self.tokenizer, self.cfg, self.device, tools=self.plan.tools,
                                   start_seconds=time.perf_counter() - started)
        self.transfer_store = self.transfer_group = None  # async: actor rank 0's end of the weight transfer
        self.published_arena = HostArena("published weights")  # fleet: rank 0's host copy, reused every publish

    def _policies(self) -> List[Policy]:
        """The actor's policy, then the reference's when there is one."""
        return [p for p in (self.policy, self.ref_policy) if p is not None]

    # ------------------------------------------------------------------ rollout
    @dispatch(SPLIT_BY_ENGINE)
    def generate(self, prompts: Batch, sampling: Dict[str, Any]) -> List[Sample]:
        """Sample ``n`` responses for each prompt row (meta ``prompt_ids``; ``rows``: the dataset rows, which the
        tool loop resets each prompt's environment with; ``groups``: the prompts' group ids); returns one ``Sample``
        per response, grouped by prompt (``EngineHost.generate_chunks``). With tensor-parallel rollouts every rank of
        an engine gets the same prompts (they run the engine together)."""
        return next(self._need_host().generate_chunks(prompts, sampling, 0))

    def generate_stream(self, prompts: Batch, sampling: Dict[str, Any], chunk_prompts: int
                        ) -> Iterator[List[Sample]]:
        """A Ray streaming generator (``WorkerGroup.stream``): the Samples of ``generate``, ``chunk_prompts``
        prompts' responses at a time, so the verifier pool can start on them while the rest are generated."""
        yield from self._need_host().generate_chunks(prompts, sampling, chunk_prompts)

    def _need_host(self) -> EngineHost:
        if self.host is None:
            raise RuntimeError("this actor worker has no rollout engine (trainer.mode=async): the RolloutWorkers "
                               "generate")
        return self.host

    @dispatch(ONE_TO_ALL)
    def sleep_engine(self) -> float:
        """Free the engine's weights and KV cache while the actor trains (vLLM on GPU with
        ``rollout.free_cache_engine``; elsewhere a no-op: ``supports_sleep`` is False). Seconds taken."""
        return self.host.sleep() if self.host is not None else 0.0  # async: the RolloutWorkers hold the engines

    @dispatch(ONE_TO_ALL)
    def wake_engine(self) -> float:
        """Bring back all the engine freed without new weights (a step whose actor update is skipped). After an
        update ``sync_weights`` wakes it instead. Seconds taken."""
        start = time.perf_counter()
        self._wake_engine(SLEEP_PARTS)
        return time.perf_counter() - start

    def _wake_engine(self, parts) -> None:
        if self.host is not None:
            self.host.wake(parts)

    # ------------------------------------------------------------------ log-probs
    @dispatch(SPLIT_BATCH)
    def compute_log_probs(self, batch: Batch) -> Batch:
        """The actor's log-probs of the responses (``old_log_probs``) and the entropy at each response token, at the
        rollout temperature (``policy.mb_log_probs``)."""
        lp, ent = self.policy.log_probs(batch, True)
        return Batch({"old_log_probs": lp, "entropy": ent})

    @dispatch(SPLIT_BATCH)
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """The reference policy's log-probs of the responses (``ref_log_probs``), at the rollout temperature like
        the actor's, so the KL compares the two at the same temperature."""
        if self.ref_policy is None:
            raise RuntimeError("no reference policy: algorithm.use_kl_loss and kl_in_reward are both off")
        lp, _ = self.ref_policy.log_probs(batch, False)
        return Batch({"ref_log_probs": lp})

    # ------------------------------------------------------------------ update
    @dispatch(SPLIT_METRICS)
    def update_actor(self, batch: Batch, kl_coef: Optional[float] = None) -> Dict[str, float]:
        """PPO-style update over this rank's share: ``ppo_epochs`` passes over mini-batches, each accumulated over
        micro-batches; the loss is normalised by global (all-rank) token or sequence counts so that any split of the
        batch across ranks and micro-batches gives the same gradient. ``kl_coef``: the KL loss weight this step (the
        trainer's KL controller; None: ``algorithm.kl_coef``)."""
        return self.policy.update(batch, self.cfg.algorithm.kl_coef if kl_coef is None else kl_coef)

    # ------------------------------------------------------------------ weight sync
    @dispatch(ONE_TO_ALL)
    def sync_weights(self) -> Dict[str, float]:
        """Stream the actor's parameters as full tensors, in buckets, into the colocated engine; a sleeping engine
        is woken on the way (weights, then the KV cache), so it is ready to generate afterwards."""
        from reasonrl.rollout.weight_sync import iter_buckets

        start = time.perf_counter()
        if self.host is None:  # async: the weights go out through send_weights
            return {"seconds": 0.0, "bytes": 0.0}
        if self.lora.adapter_only:  # the adapter alone, gathered tensor by tensor (the base never moves)
            tensors = list(self.lora.sync_tensors(self.policy.model, self.device, self.compute_dtype))
            moved = self.host.load_adapter(tensors, self.lora.adapter_config(name for name, _ in tensors))
            return {"seconds": time.perf_counter() - start, "bytes": float(moved)}
        bucket_bytes = self.plan.bucket_bytes
        # An offloaded actor is gathered from the CPU shard by shard: the whole model never comes back for the sync.
        # With LoRA merged for rollout: each adapted weight leaves as W + alpha/r B A.
        moved = self.host.load_weights(iter_buckets(self.lora.sync_tensors(self.policy.model, self.device,
                                                                           self.compute_dtype), bucket_bytes))
        return {"seconds": time.perf_counter() - start, "bytes": float(moved)}

    @dispatch(RANK_ZERO)
    @torch.no_grad()
    def check_weight_sync(self, prompt_ids: List[int], response_ids: List[int]) -> Dict[str, float]:
        """Debug: the engine's log-probs of a fixed sequence against the actor's (max/mean abs difference).
        Every rank runs it (the actor's forward is an FSDP collective); rank 0's numbers are reported. Both sides
        are at temperature 1, whatever ``rollout.temperature``: the engine scores the sequence as a prompt, and vLLM
        applies no sampling processing (temperature, top-p/top-k) to prompt log-probs; a weight mismatch shows at
        any temperature."""
        from reasonrl.rollout.weight_sync import check_adapter_reached_engine, logprob_diff

        engine_lp = self._need_host().sequence_logprobs(prompt_ids, response_ids)
        actor_lp = self.policy.sequence_log_probs(prompt_ids, response_ids)
        metrics = logprob_diff(engine_lp, actor_lp).as_metrics()
        if self.lora.on:  # the engine must score as the actor WITH its adapter, not as the base model
            base = self.ref_policy or Policy.reference(self.policy.model, self.cfg, self.batch_plan, self.device,
                                                       self.world_size, shared_offload=self.policy.offload)
            metrics.update(check_adapter_reached_engine(engine_lp, actor_lp,
                                                        base.sequence_log_probs(prompt_ids, response_ids)))
        return metrics

    @dispatch(RANK_ZERO)
    @torch.no_grad()
    def actor_sequence_logprobs(self, prompt_ids: List[int], response_ids: List[int]) -> List[float]:
        """The actor's log-probs (temperature 1) of ``response_ids`` after ``prompt_ids``: the actor's side of the
        fleet's per-replica weight-sync check (``fleet.weight_check``). Every rank runs it (an FSDP collective)."""
        return self.policy.sequence_log_probs(prompt_ids, response_ids)

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
        """What ``send_weights`` sends: every parameter's name, full shape and dtype (LoRA: the adapter's tensors, or
        the merged weights)."""
        if self.lora.on:
            return self.lora.specs(self.policy.model, self.compute_dtype)
        return weight_transfer.param_specs(self.policy.model.named_parameters(), self.compute_dtype)

    @dispatch(ONE_TO_ALL)
    def send_weights(self, specs: List[weight_transfer.ParamSpec]) -> Dict[str, float]:
        """Gather the full parameters (every rank: an FSDP collective) and broadcast them from rank 0, in buckets."""
        start = time.perf_counter()
        params = self.lora.sync_tensors(self.policy.model, self.device, self.compute_dtype)
        if self.rank != 0:
            for _ in params:
                pass
            return {"seconds": time.perf_counter() - start, "bytes": 0.0}
        bucket_bytes = self.plan.bucket_bytes
        sent = weight_transfer.send(self.transfer_group, params, specs, bucket_bytes)
        return {"seconds": time.perf_counter() - start, "bytes": float(sent)}

    @dispatch(RANK_ZERO)
    def gather_weights(self) -> Dict[str, Any]:
        """The full parameters put into Ray's object store by rank 0 (``reasonrl.workers.published_weights``), for a
        fleet's replicas (``fleet.enabled``: a replaced replica takes them too, so no collective group holds the
        replicas). Every rank gathers (an FSDP collective); rank 0 returns ``published_weights.put``'s
        ``{"ref": [ObjectRef], "bytes": n, "copy_s": s, "put_s": s}``, the others ``{}``. Rank 0 copies to the host
        into ``published_arena`` (sized from the specs, page-locked on a GPU, kept for the next publish)."""
        params = self.lora.sync_tensors(self.policy.model, self.device, self.compute_dtype)
        if self.rank != 0:
            for _ in params:
                pass
            return {}
        specs = self.lora.specs(self.policy.model, self.compute_dtype)
        self.published_arena.begin(staged_bytes([(s.shape, getattr(torch, s.dtype)) for s in specs]))
        return put(params, self.published_arena)

    # ------------------------------------------------------------------ checkpoints
    @dispatch(ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        """The actor's part of a checkpoint (``Policy.save``: model, optimizer, scheduler, RNG states; with LoRA the
        adapter too); the ranks wait for each other before the checkpoint is sealed."""
        self.policy.save(Path(directory), self.rank, self.tokenizer, self.lora)
        dist.barrier()

    @dispatch(ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        self.policy.load(Path(directory), self.rank, self.lora)

    @dispatch(ONE_TO_ALL)
    def pop_offload_timing(self) -> Dict[str, float]:
        """Seconds spent moving the actor (params, gradients, optimizer state) and the reference model between the
        device and the CPU since the last call: ``timing_s/{offload,onload}_{actor,ref}`` (empty with offload off)."""
        return {k: v for p in self._policies() for k, v in p.offload.pop_metrics().items()}

    @dispatch(ONE_TO_ALL)
    def info(self) -> Dict[str, Any]:
        import ray

        engine = self.host.engine if self.host is not None else None
        return {"rank": self.rank, "device": self.device, "engine": engine.name if engine else "none",
                "pid": os.getpid(), "threads": torch.get_num_threads(),
                "engine_can_sleep": bool(engine and engine.supports_sleep),
                "engine_start_s": self.host.start_seconds if self.host is not None else None,
                "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
                "node_ip": ray.util.get_node_ip_address() if ray.is_initialized() else None,
                "engine_ranks": self.cfg.rollout.tensor_parallel_size}
