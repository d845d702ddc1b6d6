"""``async_rollout.share_devices``: one GPU holds an actor rank and its rollout replicas' engines, all resident.

The replica's engine never sleeps (it generates while the actor trains), so every phase of the actor's step
(``plan_memory``'s async phases: its own rollout wait, log-probs, reference, update, weight send) has the engine's
terms beside the trainer's: vLLM on a GPU takes ``async_rollout.engine_memory_fraction`` x the device (its weights
P dt and, the rest, KV cache and workspace; it cannot start when that leaves no room for one sequence's KV cache);
the hf engine a dt copy of the weights and the generate KV cache of its share of a step's samples. The replica is a
process of its own: one more CUDA context, and a vLLM replica holds ``VLLM_REPLICA_BEYOND_SHARE_BYTES`` more than its
share (measured). The weight phase adds the replica's receive buffer (one packed bucket,
or the largest full parameter when that is larger), as on a rollout worker's own GPU (``plan_rollout_worker``).
With separate pools (``share_devices`` off) each pool is planned on its own (``plan_memory``, ``plan_rollout_worker``)
and none of this applies.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Mapping, Tuple

from .shape import ModelShape
from .terms import CUDA_CONTEXT_BYTES, GIB, engine_terms

FRACTION_KEY = "async_rollout.engine_memory_fraction"
VLLM_REPLICA_BEYOND_SHARE_BYTES = 2.96 * GIB
"""Measured: device memory a vLLM replica sharing the GPU holds beyond ``engine_memory_fraction`` x the device and
its CUDA context (``CUDA_CONTEXT_BYTES``, counted apart). On an H100 (79.18 GiB, vLLM 0.26.0, CUDA graphs on, the
1.5B shape at 0.3) its process held 27.72 GiB: 23.75 share + 1 context + 2.96
(benchmarks/results/s18_async_oom.json, the out-of-memory error's figures). Inside its share in the colocated
layout, where vLLM's profiling counts the whole process; planned only beside an actor rank."""
REPLICA = "replica "
"""The prefix of the replica's terms in the plan's table."""


def engine_fraction(cfg: Any) -> float:
    """The replica engine's share of a shared GPU (``async_rollout.engine_memory_fraction``)."""
    return float(cfg.async_rollout.engine_memory_fraction)


def with_resident_engine(phases: List[Any], cfg: Any, shape: ModelShape, device: str, device_bytes: float, dt: int,
                         rows: int, P: int, bucket: float, replicas: int = 1) -> Tuple[List[Any], List[str]]:
    """``phases`` (the actor rank's, ``PhasePlan``) each with ``replicas`` replica engines resident beside it (see
    the module docstring; each its own terms, named "replica i ..." when there are several, and its own CUDA
    context), and the notes that refuse the layout whatever the totals. ``rows``: one replica's share of a step's
    samples; ``bucket``: the weight receive buffer's bytes."""
    engine_cfg = replace(cfg, rollout=replace(cfg.rollout, gpu_memory_utilization=engine_fraction(cfg)))
    engine, generating, _, notes = engine_terms(engine_cfg, shape, 1, device, device_bytes, dt, rows, P)
    notes = [n.replace("rollout.gpu_memory_utilization", FRACTION_KEY) for n in notes]
    one = dict(**engine, **generating)
    if "engine KV cache + workspace" in engine:  # vLLM on a GPU
        one["engine beyond its share (CUDA graphs, measured)"] = VLLM_REPLICA_BEYOND_SHARE_BYTES
    prefixes = [REPLICA] if replicas == 1 else [f"{REPLICA}{i + 1} " for i in range(replicas)]
    resident = {prefix + k: v for prefix in prefixes for k, v in one.items()}
    context = CUDA_CONTEXT_BYTES * replicas if device == "cuda" else 0.0
    out = []
    for p in phases:
        terms = {**p.terms, **resident}
        if p.name == "weight_send":
            terms.update({prefix + "weight receive buffer (one packed bucket)": bucket for prefix in prefixes})
        out.append(replace(p, terms=terms, overhead=p.overhead + context))
    return out, notes


def describe_share(cfg: Any, device_bytes: float, replicas: int = 1) -> str:
    """What a shared GPU holds, for the refusal's message: the keys and the engines' figure."""
    fraction = engine_fraction(cfg)
    engines = "a replica's engine" if replicas == 1 else f"{replicas} replicas' engines"
    each = "the engine" if replicas == 1 else "each engine"
    return (f"async_rollout.share_devices=true: each GPU holds an actor rank and {engines}, awake together; "
            f"{FRACTION_KEY}={fraction:g} gives {each} {fraction * device_bytes / GIB:.1f} GiB of "
            f"{device_bytes / GIB:.1f}, the trainer the rest")


ALLOCATOR_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
"""What the workers of a shared GPU run with: on the H100 the 1.5B shape at the default fraction ran out of memory in
its second update with 1.42 GiB reserved by torch but free, and ran its 10 steps with this
(benchmarks/results/s18_async_oom.json against s18_async_nopartial.json)."""


def allocator_env(share_devices: bool, device: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """``ALLOCATOR_ENV`` for the workers when actor ranks and replicas share GPUs, unless ``environ`` (the user's
    environment) sets ``PYTORCH_CUDA_ALLOC_CONF`` already; nothing otherwise."""
    if not (share_devices and device == "cuda") or "PYTORCH_CUDA_ALLOC_CONF" in environ:
        return {}
    return dict(ALLOCATOR_ENV)
