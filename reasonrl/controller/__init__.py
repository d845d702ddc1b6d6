"""The single controller's tools: Ray start-up, placement over the cluster, and WorkerGroup (split, call, gather)."""
from .placement import ClusterTooSmallError, free_port
from .worker_group import GenerationError, WorkerGroup, cpus_per_worker, mean_metrics, start_ray

__all__ = ["ClusterTooSmallError", "GenerationError", "WorkerGroup", "cpus_per_worker", "free_port", "mean_metrics", "start_ray"]
