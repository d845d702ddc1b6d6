"""Backends: who runs the worker groups of a run.

``RayBackend`` (what ``reasonrl.train`` uses) starts Ray and one Ray actor per rank (``controller.WorkerGroup``);
``InProcessBackend`` builds the same worker classes in this process (``controller.in_process.InProcessGroup``: same
dispatch rules, one thread per worker so calls queue as they do on a Ray actor). Benchmarks and the fast tests of the
loop use the in-process one; the loop cannot tell them apart.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from reasonrl.config import Config, to_dict
from reasonrl.logging import library_output

from .progress import timed


@dataclass
class Groups:
    """The worker groups of a run: the actor group (with the colocated engines), the PPO critic's, the async
    rollout workers'."""

    actor: Any
    critic: Optional[Any] = None
    rollouts: Optional[Any] = None
    layout: Optional[Any] = None
    """The run's ``controller.layout.Layout`` (roles on pools, checked against the cluster); None in-process."""
    actor_info: Optional[list] = None
    """Each actor rank's ``info()``, taken as the last act of ``workers_up`` (its models loaded, its engine started)."""


def default_workers():
    """The worker classes of a run: (actor, critic, rollout)."""
    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from reasonrl.workers.critic import CriticWorker
    from reasonrl.workers.rollout_worker import RolloutWorker

    return ActorRolloutRefWorker, CriticWorker, RolloutWorker


def workers_up_what(plan) -> str:
    """What starting the worker groups does, for the line printed before and after it."""
    engine = "the rollout engine" if plan.world_size == 1 else "the rollout engines"
    return f"starting {plan.world_size} worker(s) on {plan.device}: loading the model and starting {engine}"


class RayBackend:
    """Worker groups as Ray actors, placed by ``controller.placement`` (``trainer.ray_address``: the cluster).
    ``own_session``: a local cluster's processes in a session of their own (``controller.ray_head``; the CLI's
    choice, which stops them at its end), out of reach of a signal to the driver's process group."""

    def __init__(self, actor_worker: Optional[type] = None, critic_worker: Optional[type] = None,
                 rollout_worker: Optional[type] = None, own_session: bool = False) -> None:
        self.own_session = own_session
        actor, critic, rollout = default_workers()
        self.actor_worker = actor_worker or actor
        self.critic_worker = critic_worker or critic
        self.rollout_worker = rollout_worker or rollout

    def start(self, cfg: Config, plan, model_path: str, startup) -> Groups:
        from reasonrl.controller import WorkerGroup, cpus_per_worker, start_ray

        from reasonrl.controller.layout import check_layout
        from reasonrl.controller.placement import node_capacities

        from reasonrl.controller.mps import prepare_shared_gpu, shared_gpu_envs

        local = cfg.trainer.ray_address in (None, "local")
        a = cfg.async_rollout  # a shared GPU: the allocator's variables, and the trainer's MPS client limits
        actor_env, replica_env = shared_gpu_envs(plan.share_devices, plan.device, a.actor_sm_percent,
                                                 a.actor_mps_priority, os.environ)
        # a GPU the actor shares with its replica: NVIDIA's MPS daemon up before any worker starts CUDA (its clients)
        prepare_shared_gpu(a.mps, plan.share_devices and plan.device == "cuda", local, actor_env)
        with startup("ray_start"), timed("starting Ray" if local
                                         else f"joining the Ray cluster at {cfg.trainer.ray_address}"):
            start_ray(cfg.trainer.ray_address, num_cpus=plan.ray_cpus, own_session=self.own_session)
            library_output.after_ray_start()  # the workers' lines to libraries.log (trainer.verbose=false)
        layout = check_layout(cfg, node_capacities())  # every role's pool fits the cluster, before any worker starts
        print("---- placement ----\n" + layout.table(), flush=True)
        cpus = cpus_per_worker(plan.world_size, plan.cpu_groups) if plan.device == "cpu" else 1
        cuda = plan.device == "cuda"
        kwargs = {"config": to_dict(cfg), "model_path": model_path, "plan": plan.for_workers()}
        # async_rollout.share_devices: each actor bundle has room for its replicas (rank r's GPU, the same CPUs again)
        room = ({"CPU": (1 + plan.replicas_per_device) * cpus, **({"GPU": 1.0} if cuda else {})}
                if plan.share_devices else None)
        with startup("workers_up"), timed(workers_up_what(plan)):  # models loaded, engines started (engine_start)
            groups = Groups(WorkerGroup(self.actor_worker, plan.world_size, cuda, cpus, kwargs,
                                        gpu_fraction=plan.gpu_share, engine_ranks=plan.engine_ranks,
                                        bundle_room=room, worker_env=actor_env), layout=layout)
            groups.actor_info = groups.actor.info()  # Ray starts actors asynchronously: this waits until they are up
            if plan.use_critic:  # PPO: a value model per rank, sharing each actor rank's GPU
                groups.critic = WorkerGroup(self.critic_worker, plan.world_size, cuda, cpus, kwargs,
                                            gpu_fraction=plan.gpu_share, worker_env=actor_env)
            rollout_kwargs = {"config": to_dict(cfg), "model_path": model_path, "plan": plan.for_workers()}
            concurrency = plan.replica_calls + 1 if cfg.rollout.partial else 1  # + weights staged while generating
            if plan.share_devices:  # replica r on actor rank r mod ranks' bundle: its GPU, awake while the actor trains
                groups.rollouts = WorkerGroup(self.rollout_worker, plan.rollout_workers, cuda, cpus, rollout_kwargs,
                                              gpu_fraction=plan.gpu_share, on_bundles_of=groups.actor,
                                              max_concurrency=concurrency, worker_env=replica_env)
            elif plan.is_async:  # rollout workers on devices of their own
                rollout_cpus = max(1, (os.cpu_count() or 1) // plan.rollout_workers) if not cuda else 1
                groups.rollouts = WorkerGroup(self.rollout_worker, plan.rollout_workers, cuda, rollout_cpus,
                                              rollout_kwargs, max_concurrency=concurrency)
        return groups


class InProcessBackend(RayBackend):
    """The same worker classes, built in this process (world size 1 per group; no Ray). ``num_threads``: torch's CPU
    threads (0: leave as it is)."""

    def __init__(self, actor_worker: Optional[type] = None, critic_worker: Optional[type] = None,
                 rollout_worker: Optional[type] = None, num_threads: int = 0) -> None:
        super().__init__(actor_worker, critic_worker, rollout_worker)
        self.num_threads = num_threads

    def start(self, cfg: Config, plan, model_path: str, startup) -> Groups:
        from reasonrl.controller.in_process import InProcessGroup

        if plan.world_size != 1 or plan.engine_ranks != 1 or plan.rollout_workers > 1:
            raise ValueError(f"the in-process backend runs one worker per group; this plan has {plan.world_size} "
                             f"actor ranks, engines of {plan.engine_ranks} and {plan.rollout_workers} rollout workers")
        kwargs = {"config": to_dict(cfg), "model_path": model_path, "plan": plan.for_workers(),
                  "num_threads": self.num_threads}
        with startup("workers_up"), timed(workers_up_what(plan)):
            groups = Groups(InProcessGroup(self.actor_worker, kwargs))
            groups.actor_info = groups.actor.info()
            if plan.use_critic:
                groups.critic = InProcessGroup(self.critic_worker, kwargs)
            if plan.is_async:
                groups.rollouts = InProcessGroup(self.rollout_worker, {"config": to_dict(cfg), "model_path": model_path,
                                                                       "plan": plan.for_workers(),
                                                                       "num_threads": self.num_threads})
        return groups
