"""``plan_rollout_worker``: the memory of one async rollout worker's device (``trainer.mode=async``).

A rollout worker (``reasonrl/workers/rollout_worker.py``) holds the engine and nothing else: no actor, reference,
optimizer or activations. Its two phases: ``rollout`` (the engine generating) and ``weight_receive`` (the engine
plus the buffer one bucket of the actor's weights arrives in, ``workers/weight_transfer.receive``). Its engine never
sleeps (it generates while the actor trains).
"""
from __future__ import annotations

from typing import Any, Mapping

from typing import Optional

from reasonrl.config.plan import RunPlan

from .plan import MemoryPlan, PhasePlan, _positive_number, one_gpu_plan
from .shape import ModelShape
from .terms import CUDA_CONTEXT_BYTES, compute_dtype_bytes, engine_terms


def plan_rollout_worker(cfg: Any, model_config: Mapping[str, Any], device_bytes: Any,
                        plan: Optional[RunPlan] = None) -> MemoryPlan:
    """The plan of one rollout worker's device of ``device_bytes`` under ``plan`` (its device, cuda or cpu, its rows
    and bucket; None: ``one_gpu_plan``). The engine's terms are
    those of the colocated engine (``terms.engine_terms``: vLLM takes ``rollout.gpu_memory_utilization`` x the
    device, weights P dt and the rest KV cache; vLLM on CPU weights + ``rollout.kv_cache_gb``; hf a dt copy plus the
    generate KV cache of this worker's share of a step's samples, the plan's responses per step /
    ``async_rollout.num_rollout_workers``), never asleep, one engine per worker (tensor parallel 1). The weight
    receive adds one packed bucket: ``rollout.weight_sync_bucket_mb``, or the largest full parameter in dt when that
    is larger (it travels alone). One CUDA context on a GPU."""
    p = plan or one_gpu_plan(cfg)
    device = p.device
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be cuda or cpu, got {device!r}")
    shape = ModelShape.from_config_json(model_config)
    dev = _positive_number(device_bytes, "device_bytes")
    dt = compute_dtype_bytes(cfg, device)
    P = shape.parameter_count()
    workers = max(1, cfg.async_rollout.num_rollout_workers)
    rows = max(1, p.batch.responses_per_step // workers)
    engine, generating, _, notes = engine_terms(cfg, shape, 1, device, dev, dt, rows, P)
    overhead = CUDA_CONTEXT_BYTES if device == "cuda" else 0.0
    largest = max(shape.vocab_size * shape.hidden_size, shape.hidden_size * shape.intermediate_size) * dt
    bucket = max(p.bucket_bytes, largest)
    phases = [PhasePlan("rollout", {**engine, **generating}, overhead, dev),
              PhasePlan("weight_receive", {**engine, "weight receive buffer (one packed bucket)": bucket}, overhead,
                        dev)]
    return MemoryPlan(phases, dev, P, notes)
