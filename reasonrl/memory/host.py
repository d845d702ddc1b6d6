"""``plan_host_memory``: what a GPU run keeps in the host's memory (offloaded shards, a sleeping engine's weights).

Ray's memory monitor kills a worker once the node's used memory passes ``RAY_memory_usage_threshold`` (0.95 by
default) of its total, so an offload plan that fits every GPU can still die on the host: the benchmarks' 7B full
fine-tune with everything offloaded held 115.13 GiB of a 125.85 GiB node at its first engine sleep (benchmarks/
README.md, ninth session). The terms, per rank on the host, bytes:

- offloaded actor shards (``actor.offload_params``): 4(P + Pa)/W, in one exact-size pinned buffer
  (``reasonrl.workers.host_memory.HostArena``), gradients being freed before each offload;
- offloaded AdamW moments (``actor.offload_optimizer``): 8 x trained/W (the same buffer rule);
- the offloaded reference (``ref.offload_params``, no LoRA): ref dtype bytes x P/W (``ref.param_dtype``: the compute
  dtype by default, fp32 when asked);
- an offloaded critic: 4 Pc/W and 8 Pc/W;
- a sleeping vLLM engine at level 1 (``rollout.sleep_level``; auto picks 1 only for an adapter-only LoRA sync): its
  weights (P dt/T) copied into pinned memory that torch's pinned allocator takes one power-of-two block per tensor for
  (pytorch/pytorch#150517): the plan rounds each of vLLM's fused tensors (qkv, gate_up, o, down, the embedding and an
  untied head, split over T ranks) up to a power of two. Level 2 keeps nothing on the host;
- with a fleet (``fleet.enabled``), actor rank 0's host copy of the weights it publishes, in one exact-size pinned
  buffer kept between publishes (``reasonrl.workers.published_weights``): P dt (adapter-only LoRA: its fp32
  adapters, 4 Pa), once, not per rank.

Not counted: each process's own memory (Python, the libraries, the CUDA driver's host side) and Ray's object store;
the check leaves them the rest of the threshold.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from .shape import ModelShape
from .terms import GIB, compute_dtype_bytes, trained_of

RAY_KILL_THRESHOLD = 0.95
"""Ray's default ``RAY_memory_usage_threshold``: the share of the node's memory past which it kills a worker."""


@dataclass
class HostPlan:
    """What the ranks of one host keep in its memory between phases."""

    terms: Dict[str, float]
    """Bytes per term, summed over the host's ranks."""
    host_bytes: float
    """The host's memory, bytes."""
    ranks: int
    """Ranks (GPUs) on this host."""
    threshold: float = RAY_KILL_THRESHOLD
    """The share of ``host_bytes`` past which Ray kills a worker (``RAY_memory_usage_threshold``)."""

    @property
    def total(self) -> float:
        """The terms' sum."""
        return float(sum(self.terms.values()))

    @property
    def limit(self) -> float:
        """``threshold`` x ``host_bytes``."""
        return self.threshold * self.host_bytes

    @property
    def fits(self) -> bool:
        """``total`` is at most ``limit``."""
        return self.total <= self.limit


def pinned_block_bytes(n: float) -> int:
    """The block torch's pinned host allocator takes for ``n`` bytes: the next power of two (at least 1)."""
    n = max(1, int(-(-n // 1)))
    return 1 << (n - 1).bit_length()


def sleeping_engine_bytes(shape: ModelShape, dt: int, tensor_parallel_size: int) -> int:
    """One engine rank's pinned copy of its weights at level-1 sleep: each of vLLM's tensors (per layer the fused
    qkv and gate_up projections, o, down and two norms; the embedding, an untied head and the final norm) split over
    T ranks (norms whole), each rounded up to a power of two (``pinned_block_bytes``)."""
    h, q, kv, i, V, T = (shape.hidden_size, shape.num_heads * shape.head_dim, shape.kv_width, shape.intermediate_size,
                         shape.vocab_size, tensor_parallel_size)
    layer = [h * (q + 2 * kv) / T, q * h / T, 2 * i * h / T, i * h / T, h, h]
    if shape.qkv_bias:
        layer.append((q + 2 * kv) / T)
    root = [V * h / T, h] + ([] if shape.tied_embeddings else [V * h / T])
    return shape.num_layers * sum(pinned_block_bytes(n * dt) for n in layer) + \
        sum(pinned_block_bytes(n * dt) for n in root)


def plan_host_memory(cfg: Any, model_config: Mapping[str, Any], host_bytes: float, world_size: int = 1,
                     ranks_on_host: Optional[int] = None, threshold: float = RAY_KILL_THRESHOLD) -> HostPlan:
    """The host terms (module docstring) of a colocated GPU step, for the ``ranks_on_host`` ranks (default: all
    ``world_size``) of one host with ``host_bytes`` of memory."""
    from reasonrl.config.plan import engine_sleep_level

    shape = ModelShape.from_config_json(model_config)
    W = world_size
    ranks = world_size if ranks_on_host is None else ranks_on_host
    dt = compute_dtype_bytes(cfg, "cuda")
    a, tr = cfg.actor, trained_of(cfg, shape, dt)
    t: Dict[str, float] = {}
    if a.offload_params:
        t["actor weights (fp32 shards, pinned arena)"] = 4 * (tr.P + tr.Pa) / W
    if a.offload_optimizer:
        t["actor AdamW moments (2 x fp32, pinned arena)"] = 8 * tr.trained / W
    if tr.ref_copy and cfg.ref.offload_params:
        label = f"reference weights ({'fp32' if tr.ref_bytes == 4 else 'dt'} shards, pinned arena)"
        t[label] = tr.ref_bytes * tr.P / W
    if cfg.algorithm.adv_estimator == "gae":
        Pc = shape.critic_parameter_count()
        if cfg.critic.offload_params:
            t["critic weights (fp32 shards, pinned arena)"] = 4 * Pc / W
        if cfg.critic.offload_optimizer:
            t["critic AdamW moments (2 x fp32, pinned arena)"] = 8 * Pc / W
    colocated = cfg.trainer.mode != "async" and cfg.rollout.engine != "hf" and cfg.rollout.free_cache_engine
    if colocated and engine_sleep_level(cfg) == 1:
        t["sleeping engine weights (level 1, pinned, power-of-two blocks)"] = \
            sleeping_engine_bytes(shape, dt, cfg.rollout.tensor_parallel_size)
    terms = {k: v * ranks for k, v in t.items()}
    if cfg.fleet.enabled:
        adapter_only = tr.lora and not a.lora.merge_for_rollout
        terms["published weights (actor rank 0, pinned arena)"] = 4 * tr.Pa if adapter_only else tr.P * dt
    return HostPlan(terms, float(host_bytes), ranks, threshold)


def ray_kill_threshold() -> float:
    """``RAY_memory_usage_threshold`` from the environment (Ray's default 0.95)."""
    try:
        return float(os.environ.get("RAY_memory_usage_threshold", RAY_KILL_THRESHOLD))
    except ValueError:
        return RAY_KILL_THRESHOLD


def render_host_plan(plan: HostPlan) -> str:
    """The host plan as text: one line per term, GiB; the total against Ray's kill threshold."""
    lines = [f"host memory plan ({plan.ranks} rank(s) on this host, GiB of {plan.host_bytes / GIB:.1f}; Ray kills a "
             f"worker past {plan.threshold:.2f} x = {plan.limit / GIB:.1f})"]
    width = max([len(k) for k in plan.terms] + [10]) + 2
    lines += [k.ljust(width) + f"{v / GIB:10.2f}" for k, v in plan.terms.items()]
    lines.append("total".ljust(width) + f"{plan.total / GIB:10.2f}   {'fits' if plan.fits else 'DOES NOT FIT'}")
    return "\n".join(lines)
