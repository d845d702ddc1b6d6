"""How the controller calls a worker method on a group (the seam verl calls @register).

The controller calls ``group.update_actor(batch)`` as if local; the mode tells the WorkerGroup how to split the
arguments across data-parallel ranks (or rollout engines, see SPLIT_BY_ENGINE) and how to gather what comes back.
Splitting and gathering live only here and in ``reasonrl.controller.worker_group``.
"""
from __future__ import annotations

from typing import Callable

ONE_TO_ALL = "one_to_all"      # same arguments to every rank; returns the list of results
SPLIT_BATCH = "split_batch"    # first argument is a Batch split evenly by rank; results (Batches or lists) concatenated
SPLIT_METRICS = "split_metrics"  # Batch split by rank; the ranks' metric dicts averaged
RANK_ZERO = "rank_zero"        # same arguments to every rank; rank 0's result returned
# Batch split evenly by rollout engine: the ranks of a tensor-parallel group share one engine and all get their group's
# part (an engine's ranks must make the same calls); the group's first rank's result is kept; results concatenated.
# The same as SPLIT_BATCH when every rank has its own engine (tensor_parallel_size 1).
SPLIT_BY_ENGINE = "split_by_engine"


def dispatch(mode: str) -> Callable:
    def mark(fn: Callable) -> Callable:
        fn.dispatch_mode = mode
        return fn

    return mark
