"""The async trainer (``trainer.mode=async``): rollout workers on their own devices generate ahead of training.

The step is the colocated one (``Trainer.train_step``: old/ref log-probs -> advantages -> update) with two changes:

* ``sample_round`` takes a batch that was started ``async_rollout.max_staleness`` steps ago and starts the batch of a
  later step; a collector thread reads each batch's chunks as the engines finish them and hands them to the verifier
  pool, so generation and verification run while the actor trains;
* after the update the new weights go from actor rank 0 to the rollout workers through their own process group
  (``reasonrl.workers.weight_transfer``), in buckets.

Order is what keeps the versions right: every call to the rollout workers is issued from this (the controller's main)
thread, and a Ray actor runs calls in the order they were issued, so a batch started before the sync of version v is
generated with older weights and one started after it with v. The engines stamp each row with the version they hold;
``async/staleness`` = step - that version is recorded each step and checked against the bound.
"""
from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Tuple

import ray

from reasonrl.config import Config, to_dict
from reasonrl.controller import WorkerGroup, start_ray
from reasonrl.fault_points import arrive, run_in_actor

from .dynamic_sampling import Round
from .metrics import PhaseTimer
from .streaming import GenerationError, collect_stream, start_stream
from .trainer import Trainer

PEER_GONE = ("Connection closed by peer", "remote worker crashing", "Connection reset by peer")
"""Phrases of gloo/NCCL errors that mean the other end of the transfer group went away."""


class RolloutWorkerError(RuntimeError):
    """A rollout worker failed or died; the message names it and what it was doing."""


@dataclass
class InFlight:
    """A batch being generated (and verified) for a later step."""

    sampler_state: Dict[str, int]
    """The data position before its prompts were drawn (what a checkpoint saves while it is in flight)."""
    round: "Future[Tuple[Round, Dict[str, float]]]"
    """The collector's result: the verified round and its timings."""


class AsyncTrainer(Trainer):
    """``Trainer`` with the actor group engine-less and a ``RolloutWorker`` group generating ahead."""

    def __init__(self, cfg: Config, actor_worker: type, rollout_worker: type) -> None:
        """``actor_worker`` / ``rollout_worker``: the worker classes of the two groups (the entry point picks them:
        ``ActorRolloutRefWorker``, built engine-less in this mode, and ``RolloutWorker``)."""
        cores = os.cpu_count() or 1
        a = cfg.async_rollout
        start_ray(cfg.trainer.ray_address, num_cpus=2 * cores)  # on CPU the two groups share the cores
        super().__init__(cfg, actor_worker)  # the actor group: engine-less because trainer.mode=async
        if self.world_size % a.num_rollout_workers and a.num_rollout_workers > 1:
            raise ValueError(f"async_rollout.num_rollout_workers={a.num_rollout_workers} must divide the "
                             f"{self.world_size} actor workers (validation pads batches to the actor count)")
        cpus = max(1, cores // a.num_rollout_workers) if self.device == "cpu" else 1
        self.rollouts = WorkerGroup(rollout_worker, a.num_rollout_workers, self.device == "cuda", cpus,
                                    {"config": to_dict(cfg), "model_path": self.model_path})
        self.weight_specs = self.workers.weight_specs()
        host, port = self.workers.open_weight_transfer()
        size = 1 + a.num_rollout_workers
        self._wait(self.workers.submit("join_weight_transfer", size),
                   self.rollouts.submit("join_weight_transfer", host, port, size), "joining the weight transfer group",
                   "join_weight_transfer")
        self.collector = ThreadPoolExecutor(1, thread_name_prefix="rollout-collector")
        self.in_flight: Deque[InFlight] = deque()
        self.round_stats: Dict[str, float] = {}
        if self.step > 0:  # resumed: the engines start from the base model
            self.sync_rollout_weights(self.step)
        for _ in range(min(a.max_staleness, cfg.trainer.total_steps - self.step)):
            self._start_round()

    @property
    def engines(self) -> WorkerGroup:
        return self.rollouts

    def worker_groups(self) -> List[WorkerGroup]:
        return super().worker_groups() + [self.rollouts]

    # ------------------------------------------------------------------ the step
    def train_step(self) -> Dict[str, Any]:
        self.round_stats = {}
        metrics = super().train_step()  # sample_round (below) -> log-probs -> advantages -> update
        timer = PhaseTimer()
        with timer("weight_sync"):
            sync = self.sync_rollout_weights(self.step + 1)
        metrics.update(self.round_stats)
        metrics["weight_sync/bytes"] = sync["bytes"]
        metrics["timing_s/weight_sync"] = timer.seconds["weight_sync"]
        metrics["timing_s/step"] = metrics.get("timing_s/step", 0.0) + timer.seconds["weight_sync"]
        return metrics

    def sample_round(self, timer: PhaseTimer) -> Round:
        """Start the batch of step ``step + max_staleness`` (if training gets there), then take this step's."""
        if not self.in_flight or self.step + len(self.in_flight) < self.cfg.trainer.total_steps:
            self._start_round()
        flight = self.in_flight.popleft()
        with timer("rollout"):  # only what the actor waits for: the rest overlapped the previous update
            try:
                rnd, seconds = flight.round.result()
            except GenerationError as exc:
                raise RolloutWorkerError(f"{exc} (the batch for step {self.step + 1})") from exc
        version = min(rnd.gen["weights_version"])
        staleness = self.step - version
        bound = self.cfg.async_rollout.max_staleness
        if not 0 <= staleness <= bound:
            raise RuntimeError(f"step {self.step} would train on a batch generated with the weights of version "
                               f"{version}: staleness {staleness} outside [0, async_rollout.max_staleness={bound}]")
        self.round_stats = {
            "async/staleness": float(max(staleness, self.round_stats.get("async/staleness", 0.0))),
            "async/weights_version": float(version),
            "async/generate_s": seconds.get("rollout", 0.0),  # generation, overlapped with training
            "async/verify_tail_s": seconds.get("verify", 0.0),  # verification left after the last response
        }
        return self.record_round(rnd)

    def _start_round(self) -> None:
        for rank, worker in enumerate(self.rollouts.workers):  # test hook (REASONRL_FAULT_AT): a worker crashes here
            action = arrive(f"rollout{rank}.generate_stream")
            if action is not None:
                worker.__ray_call__.remote(run_in_actor, action)  # issued before the generation, so it runs first
        state = self.sampler.state_dict()
        indices = self.sampler.next_indices()
        prompts = [self.train_data[i] for i in indices]
        streams = start_stream(self.rollouts, prompts, self.sampling(), self.cfg.rollout.stream_chunk_prompts)
        self.in_flight.append(InFlight(state, self.collector.submit(self._collect, streams, prompts, indices)))

    def _collect(self, streams: List[Any], prompts: List[Any],
                 indices: List[int]) -> Tuple[Round, Dict[str, float]]:
        """Collector thread: the round's chunks to the verifier pool as they come; the verified round."""
        timer = PhaseTimer()
        gen, results = collect_stream(self.rollouts, streams, prompts, self.pool, self.cfg.reward, timer)
        return Round(prompts, gen, results, indices), timer.seconds

    # ------------------------------------------------------------------ weights
    def sync_rollout_weights(self, version: int) -> Dict[str, float]:
        """Actor rank 0 broadcasts the weights of ``version``; the rollout workers load them. The receive calls queue
        behind the generation already started, so the engines stop only for the copy."""
        sent = self._wait(self.workers.submit("send_weights", self.weight_specs),
                          self.rollouts.submit("receive_weights", self.weight_specs, version),
                          f"syncing the weights of version {version}", "weight_broadcast")
        return {"bytes": sent[0]["bytes"]}

    def _wait(self, actor_refs: List[Any], rollout_refs: List[Any], what: str, phase: str) -> List[Any]:
        """Results of calls on both groups; the first failure raises, naming the worker (a rollout worker whose
        death broke the actor's collective is named, not the actor). Watched like every phase: past the watchdog's
        limit for ``phase`` the ranks that did not answer are named with their stacks (PhaseHangError)."""
        owner = {ref: ("ActorRolloutRefWorker", rank) for rank, ref in enumerate(actor_refs)}
        owner.update({ref: ("RolloutWorker", rank) for rank, ref in enumerate(rollout_refs)})
        results: Dict[Any, Any] = {}
        remaining = list(owner)
        watchdog = self.workers.watchdog  # the actor group's (trainer.watchdog_*), over both groups' ranks
        limit = watchdog.limit_s(phase) if watchdog is not None else None
        start = time.monotonic()
        while remaining:
            left = None if limit is None else max(0.0, start + limit - time.monotonic())
            ready, remaining = ray.wait(remaining, num_returns=1, timeout=left)
            if not ready:  # past the phase's limit: name the ranks that did not answer, with their stacks
                for group, refs in ((self.workers, actor_refs), (self.rollouts, rollout_refs)):
                    ranks = [r for r, ref in enumerate(refs) if ref in remaining]
                    if ranks:
                        watchdog.hung(group.worker_cls.__name__, phase, ranks, time.monotonic() - start,
                                      group.dump_stacks(ranks))
            try:
                results[ready[0]] = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                name, rank = owner[ready[0]]
                if name == "ActorRolloutRefWorker" and any(p in str(exc) for p in PEER_GONE):
                    for r, ref in enumerate(rollout_refs):  # the peer went away: they resolve (or time out)
                        try:
                            ray.get(ref)
                        except ray.exceptions.RayError as peer_exc:
                            raise RolloutWorkerError(f"RolloutWorker rank {r} failed while {what}: "
                                                     f"{peer_exc}") from peer_exc
                error = RolloutWorkerError if name == "RolloutWorker" else RuntimeError
                raise error(f"{name} rank {rank} failed while {what}: {exc}") from exc
        if watchdog is not None:
            watchdog.record(phase, time.monotonic() - start)
        return [results[ref] for ref in actor_refs + rollout_refs]

    # ------------------------------------------------------------------ checkpoints and shutdown
    def save(self):
        """A checkpoint's data position is that of the first batch not yet trained on: batches in flight are drawn
        again after a resume."""
        live = self.sampler.state_dict()
        if self.in_flight:
            self.sampler.load_state_dict(self.in_flight[0].sampler_state)
        try:
            return super().save()
        finally:
            self.sampler.load_state_dict(live)

    def close(self) -> None:
        if self.collector is None:
            return
        self.collector.shutdown(wait=False, cancel_futures=True)
        self.collector = None
        try:
            super().close()
        finally:
            self.rollouts.shutdown()
