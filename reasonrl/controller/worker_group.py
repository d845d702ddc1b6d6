"""WorkerGroup: one Ray actor per data-parallel rank, called as if it were one local object.

``group.update_actor(batch)`` looks up the method's dispatch mode (``reasonrl.workers.dispatch``), splits the batch
by rank, calls every rank, and gathers the results. This is the only place that splits and gathers.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Callable, Dict, List

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from reasonrl.data.batch import Batch
from reasonrl.workers.dispatch import ONE_TO_ALL, RANK_ZERO, SPLIT_BATCH, SPLIT_METRICS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mean_metrics(dicts: List[Dict[str, float]]) -> Dict[str, float]:
    keys = sorted({k for d in dicts for k in d})
    return {k: sum(d[k] for d in dicts if k in d) / sum(1 for d in dicts if k in d) for k in keys}


class WorkerGroup:
    """``world_size`` copies of ``worker_cls`` in one placement group (one bundle per rank)."""

    def __init__(self, worker_cls: type, world_size: int, use_gpu: bool, cpus_per_worker: int,
                 init_kwargs: Dict[str, Any], gpu_fraction: float = 1.0) -> None:
        """``gpu_fraction`` < 1 lets another group (the PPO critic) share each rank's GPU."""
        self.worker_cls = worker_cls
        self.world_size = world_size
        gpus = gpu_fraction if use_gpu else 0
        bundle = {"CPU": cpus_per_worker, **({"GPU": gpus} if use_gpu else {})}
        self.placement_group = placement_group([dict(bundle) for _ in range(world_size)], strategy="PACK")
        ray.get(self.placement_group.ready())
        master_addr, master_port = "127.0.0.1", free_port()
        remote_cls = ray.remote(worker_cls)
        env = {"OMP_NUM_THREADS": str(cpus_per_worker)}
        self.workers = [
            remote_cls.options(
                num_cpus=cpus_per_worker, num_gpus=gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=r),
                runtime_env={"env_vars": env},
            ).remote(**init_kwargs, rank=r, world_size=world_size, master_addr=master_addr, master_port=master_port,
                     num_threads=cpus_per_worker)
            for r in range(world_size)
        ]

    def __getattr__(self, name: str) -> Callable:
        method = getattr(self.worker_cls, name, None)
        mode = getattr(method, "dispatch_mode", None)
        if mode is None:
            raise AttributeError(f"{self.worker_cls.__name__}.{name} is not a dispatchable worker method")
        return lambda *args, **kwargs: self._call(name, mode, *args, **kwargs)

    def _call(self, name: str, mode: str, *args: Any, **kwargs: Any) -> Any:
        if mode in (SPLIT_BATCH, SPLIT_METRICS):
            batch, rest = args[0], args[1:]
            parts = batch.chunk(self.world_size)
            refs = [getattr(w, name).remote(p, *rest, **kwargs) for w, p in zip(self.workers, parts)]
            results = ray.get(refs)
            return Batch.concat(results) if mode == SPLIT_BATCH else mean_metrics(results)
        refs = [getattr(w, name).remote(*args, **kwargs) for w in self.workers]
        results = ray.get(refs)
        if mode == RANK_ZERO:
            return results[0]
        if mode == ONE_TO_ALL:
            return results
        raise ValueError(f"unknown dispatch mode {mode!r}")

    def stream(self, name: str, batch: Batch, *args: Any) -> List[Any]:
        """Start the generator method ``name`` on every rank with its share of ``batch`` (split as SPLIT_BATCH), as
        Ray streaming calls: one ``ObjectRefGenerator`` per rank, in rank order, each yielding refs to Batches."""
        parts = batch.chunk(self.world_size)
        return [getattr(w, name).options(num_returns="streaming").remote(p, *args)
                for w, p in zip(self.workers, parts)]

    def submit(self, name: str, *args: Any, **kwargs: Any) -> List[Any]:
        """Start ``name`` (same arguments to every rank) without waiting: the ranks' ObjectRefs, in rank order."""
        return [getattr(w, name).remote(*args, **kwargs) for w in self.workers]

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.placement_group)


def start_ray(address: str | None, num_cpus: int | None = None) -> None:
    """Start (or join) Ray once, passing this process's environment on to the workers."""
    if ray.is_initialized():
        return
    env_keys = ("HF_HUB_OFFLINE", "REASONRL_CACHE", "REASONRL_DATA_DIR", "VLLM_ENABLE_V1_MULTIPROCESSING",
                "VLLM_CPU_KVCACHE_SPACE", "TOKENIZERS_PARALLELISM", "PYTHONPATH", "HF_HOME")
    env = {k: os.environ[k] for k in env_keys if k in os.environ}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # None or "local": a new cluster of our own, even when another one runs on this machine (ray.init() would join it)
    joining = address not in (None, "local")
    ray.init(address=address if joining else "local", num_cpus=None if joining else num_cpus, include_dashboard=False,
             log_to_driver=True, logging_level="WARNING", runtime_env={"env_vars": env})
