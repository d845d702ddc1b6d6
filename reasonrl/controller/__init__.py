"""The single controller's tools: Ray start-up and WorkerGroup (split by rank, call, gather)."""
from .worker_group import WorkerGroup, free_port, mean_metrics, start_ray

__all__ = ["WorkerGroup", "free_port", "mean_metrics", "start_ray"]
