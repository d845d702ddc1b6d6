"""``plan_memory``: the expected peak memory per GPU in each phase of one colocated step (see ``reasonrl.memory``)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional

from reasonrl.config.device_defaults import Hardware
from reasonrl.config.plan import RunPlan

from .shape import ModelShape
from .terms import (ADAMW_STEP_LABELS, CUDA_CONTEXT_BYTES, activation_bytes, adamw_step_bytes, compute_dtype_bytes,
                    engine_terms, head_backward_bytes, head_forward_bytes, micro_batch_tokens, no_grad_forward_bytes,
                    packed_mask_bytes, trained_of)


@dataclass
class PhasePlan:
    """One phase: the terms on the device (name -> bytes), the process overhead, and the device's size."""

    name: str
    """rollout, log_probs, reference, values, critic_update, update, weight_sync or (async) weight_send; on an async
    rollout worker's device rollout and weight_receive (``plan_rollout_worker``)."""
    terms: Dict[str, float]
    """What is on the device at the phase's peak, bytes per term (the term's name says what it is)."""
    overhead: float
    """Bytes outside torch's allocator: the CUDA context of each process on the GPU (``CUDA_CONTEXT_BYTES``)."""
    device_bytes: float
    """The device's memory, bytes."""

    @property
    def allocated(self) -> float:
        """The terms' sum: what torch's allocator (and vLLM's pool) would hold at the phase's peak."""
        return float(sum(self.terms.values()))

    @property
    def total(self) -> float:
        """``allocated`` plus the CUDA context of each process on the GPU."""
        return self.allocated + self.overhead

    @property
    def fits(self) -> bool:
        """``total`` is at most the device's memory."""
        return self.total <= self.device_bytes


@dataclass
class MemoryPlan:
    """Every phase of one step on one GPU (``phases`` in step order; a phase the config never runs is absent)."""

    phases: List[PhasePlan]
    """The phases the config runs, in step order."""
    device_bytes: float
    """The device's memory, bytes."""
    parameters: int
    """P, the model's parameter count (from ``config.json``)."""
    notes: List[str] = field(default_factory=list)
    """Reasons the layout cannot run whatever the totals (vLLM cannot start: no room for one sequence's KV cache)."""

    def phase(self, name: str) -> PhasePlan:
        """The phase called ``name`` (KeyError listing the phases this plan has)."""
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase {name!r} in this plan (phases: {', '.join(p.name for p in self.phases)})")

    @property
    def peak(self) -> PhasePlan:
        """The phase with the largest ``total``."""
        return max(self.phases, key=lambda p: p.total)

    @property
    def fits(self) -> bool:
        """Every phase fits and nothing else refuses the layout (``notes`` says why not)."""
        return all(p.fits for p in self.phases) and not self.notes


def _positive_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of bytes, got {value!r}")
    return float(value)


def one_gpu_plan(cfg: Any) -> RunPlan:
    """The plan of ``cfg`` on one GPU (what a memory plan assumes when it is given none)."""
    one = replace(cfg, trainer=replace(cfg.trainer, num_workers=1))
    return RunPlan.build(one, Hardware(device="cuda", gpu_count=1))


def _check_placement(plan: RunPlan, shape: ModelShape) -> None:
    t = plan.engine_ranks  # the world size and tensor-parallel size divide (``RunPlan.build``)
    if shape.num_heads % t or shape.num_kv_heads % t:
        raise ValueError(f"tensor_parallel_size={t} must divide the attention heads ({shape.num_heads}) and KV heads "
                         f"({shape.num_kv_heads})")
    if plan.device not in ("cuda", "cpu"):
        raise ValueError(f"the plan's device must be cuda or cpu, got {plan.device!r}")



def plan_memory(cfg: Any, model_config: Mapping[str, Any], device_bytes: Any,
                plan: Optional[RunPlan] = None, old_log_prob_pass: Optional[bool] = None) -> MemoryPlan:
    """The expected peak memory per GPU in each phase of one colocated step of ``cfg`` under ``plan`` (its ranks,
    engine shards, critic, mode, batch rows, passes and weight sync; None: ``one_gpu_plan``; see the module docstring).
    ``old_log_prob_pass``: None decides as the trainer does (``reasonrl.config.passes``); True/False forces it (a
    benchmark's ``--old-log-prob-pass always``). The plan is the steady state: AdamW moments exist (from the first
    optimizer step on) and the reference's root is unsharded (from its first forward on).

    Resident terms: the actor's fp32 shards (4P/W) and AdamW moments (8P/W), the reference's shards (dt P/W;
    4P/W with ``ref.param_dtype=float32``) and its FSDP root, kept unsharded in dt after its forward (V h (x2
    untied) + h); offload
    (``actor.offload_params``/``offload_optimizer``, ``ref.offload_params``, ``critic.offload_*``) keeps a term
    only in the phases that use it. The update adds fp32 gradients (4P/W), the actor's unsharded root, two FSDP
    layers in flight (gathered in dt, reduced in fp32), the saved activations and the head's backward or forward,
    whichever is larger, or, when larger than those, the AdamW step's temporaries (``adamw_step_bytes``, by
    ``actor.adamw_impl``). The weight sync holds the engine's weights, one bucket (``rollout.weight_sync_bucket_mb``)
    and the largest full parameter before the KV cache wakes. ``trainer.mode=async``: no engine on the actor's
    devices; its ``weight_send`` phase (rank 0 broadcasting) holds a bucket (at least the largest full parameter,
    which travels alone when larger), its packed copy and the next gathered parameter. With
    ``async_rollout.share_devices`` a replica's engine shares the GPU, resident in every phase
    (``shared_gpu.with_resident_engine``: at ``async_rollout.engine_memory_fraction``, one more CUDA context, its
    receive buffer in the weight phase).

    LoRA (``actor.lora.rank`` > 0; Pa adapter parameters, ``ModelShape.lora_parameters``): the actor's shards hold
    the frozen base and the adapters (4(P + Pa)/W); AdamW moments and gradients exist for the adapters only (8Pa/W,
    4Pa/W); there is no reference copy (the reference pass is the actor with its adapters off); the saved
    activations gain A x per adapted projection and lose the frozen norms' inputs; the frozen head's backward keeps
    no weight gradient; FSDP reduces only the adapters' gradients. An adapter-only sync gathers every adapter tensor
    in fp32 at once (4Pa, no bucket); a merged sync holds the bucket and, at the largest adapted projection, its fp32
    weight, B A, their sum and the merged copy in dt. Host memory (offloaded shards, a sleeping engine's weights) is
    planned apart (``reasonrl.memory.host.plan_host_memory``)."""
    from reasonrl.config.token_budget import auto_budget_keys

    unresolved = auto_budget_keys(cfg)
    if unresolved:
        raise ValueError(f"{', '.join(unresolved)}=auto: resolve it first (reasonrl.memory.resolve_auto_budgets)")
    p = plan or one_gpu_plan(cfg)
    shape = ModelShape.from_config_json(model_config)
    _check_placement(p, shape)
    dev = _positive_number(device_bytes, "device_bytes")
    dt = compute_dtype_bytes(cfg, p.device)
    P, W = shape.parameter_count(), p.world_size
    critic, passes = p.use_critic, p.passes
    rows, mini_rows = p.batch.rows_per_worker, max(1, p.batch.responses_per_mini_batch_per_worker)
    if p.is_async:  # the engines run on the rollout workers' devices (``plan_rollout_worker``)
        engine, generating, sleeps, notes = {}, {}, False, []
    else:
        engine, generating, sleeps, notes = engine_terms(cfg, shape, p.engine_ranks, p.device, dev, dt, rows,
                                                         P)
    a = cfg.actor
    tr = trained_of(cfg, shape, dt)
    has_ref, lora, Pa, trained, ref_copy, ref_bytes = tr.has_ref, tr.lora, tr.Pa, tr.trained, tr.ref_copy, tr.ref_bytes
    trained_layer = shape.lora_layer_parameters(a.lora.rank, a.lora.target_modules) if lora \
        else shape.layer_parameters()
    adapters = ", adapters" if lora else ""
    root = shape.root_parameters() * dt
    layer_gather = 2 * shape.layer_parameters() * dt
    overhead = CUDA_CONTEXT_BYTES * (2 if critic else 1) if p.device == "cuda" else 0.0

    def resident(phase: str) -> Dict[str, float]:
        t: Dict[str, float] = {}
        if not a.offload_params or phase in ("log_probs", "update"):
            t[f"actor weights (fp32 shards{', base + adapters' if lora else ''})"] = 4 * (P + Pa) / W
        if not a.offload_optimizer or phase == "update":
            t[f"actor AdamW moments (2 x fp32{adapters})"] = 8 * trained / W
        if ref_copy and (not cfg.ref.offload_params or phase == "reference"):
            t[f"reference weights ({'fp32' if ref_bytes == 4 else 'dt'} shards)"] = ref_bytes * P / W
            t["reference root (unsharded, dt)"] = root
        if critic:
            c = cfg.critic
            Pc = shape.critic_parameter_count()
            if not c.offload_params or phase in ("values", "critic_update"):
                t["critic weights (fp32 shards)"] = 4 * Pc / W
            if not c.offload_optimizer or phase == "critic_update":
                t["critic AdamW moments (2 x fp32)"] = 8 * Pc / W
        return t

    def awake() -> Dict[str, float]:
        return dict(engine)

    def forward_pass(phase: str, budget: int, head: bool, entropy: bool, label: str) -> PhasePlan:
        tokens, resp = micro_batch_tokens(cfg, rows, budget)
        t = {**resident(phase), **awake(), f"{label} root (unsharded, dt)": root,
             "FSDP layers in flight (2 x dt)": layer_gather,
             f"forward temporaries ({tokens} tokens)": no_grad_forward_bytes(shape, tokens, resp, dt, head, entropy)}
        if packed_mask_bytes(cfg, tokens):
            t["packed attention mask (N x N)"] = packed_mask_bytes(cfg, tokens)
        return PhasePlan(phase, t, overhead, dev)

    from reasonrl.config.worker_plan import adamw_impl

    impl = adamw_impl(cfg, p.device)
    h, i, V = shape.hidden_size, shape.intermediate_size, shape.vocab_size
    largest_full = max(V * h, h * i)  # the embedding (or head) or an MLP weight

    def training_pass(phase: str, budget: int, Pm: int, label: str, head: bool, entropy: bool,
                      compiled: bool, reduced_layer: int, extra_per_token_layer: float = 0.0,
                      largest_trained: int = largest_full) -> PhasePlan:
        tokens, resp = micro_batch_tokens(cfg, mini_rows, budget)
        t = {**resident(phase), **({} if sleeps else awake()),
             f"{label} gradients (fp32 shards)": 4 * Pm / W, f"{label} root (unsharded, dt)": root,
             "FSDP layers in flight (2 x dt gathered, 2 x fp32 reduced)":
                 2 * shape.layer_parameters() * dt + 2 * reduced_layer * 4,
             f"activations ({tokens} tokens{', checkpointed' if cfg.model.gradient_checkpointing else ''})":
                 activation_bytes(cfg, shape, tokens, dt, compiled, extra_per_token_layer)}
        if head:
            t["log-prob head (chunk of logits)"] = max(head_backward_bytes(shape, resp, frozen_head=lora),
                                                       head_forward_bytes(shape, resp, entropy))
        if packed_mask_bytes(cfg, tokens):
            t["packed attention mask (N x N)"] = packed_mask_bytes(cfg, tokens)
        backward = [k for k in t if k.startswith(("activations", "log-prob head", "packed attention"))]
        step = adamw_step_bytes(impl, Pm, largest_trained, W)
        if step > sum(t[k] for k in backward):  # the optimizer step, after the backward freed them, is the peak
            for k in backward:
                del t[k]
            t[f"AdamW step temporaries ({ADAMW_STEP_LABELS[impl]}, fp32)"] = step
        return PhasePlan(phase, t, overhead, dev)

    phases = [PhasePlan("rollout", {**resident("rollout"), **awake(), **generating}, overhead, dev)]
    old_pass = passes.old_log_probs if old_log_prob_pass is None else bool(old_log_prob_pass)
    if old_pass:
        phases.append(forward_pass("log_probs", a.max_tokens_per_micro_batch, True, True, "actor"))
    if has_ref:
        phases.append(forward_pass("reference", cfg.ref.max_tokens_per_micro_batch or a.max_tokens_per_micro_batch,
                                   True, False, "actor (adapters off)" if lora else "reference"))
    if critic:
        budget = cfg.critic.max_tokens_per_micro_batch or a.max_tokens_per_micro_batch
        phases.append(forward_pass("values", budget, False, False, "critic"))
        phases.append(training_pass("critic_update", budget, shape.critic_parameter_count(), "critic", False, False,
                                    False, shape.layer_parameters()))
    own_old = not old_pass
    lora_saved = shape.lora_activation_delta_per_token_layer(a.lora.rank, a.lora.target_modules, dt) if lora else 0.0
    phases.append(training_pass("update", a.max_tokens_per_micro_batch, trained, f"actor{adapters}", True,
                                own_old or cfg.algorithm.entropy_coef != 0, a.compile, trained_layer, lora_saved,
                                a.lora.rank * max(h, i) if lora else largest_full))
    largest = largest_full * dt
    bucket = p.bucket_bytes
    if engine:
        sync = {**resident("weight_sync"), **awake()}
        if p.lora_sync == "adapter":  # workers/lora_sync.py: the adapter alone, gathered at once
            sync["LoRA adapter (gathered, fp32)"] = 4 * Pa
        elif p.lora_sync == "merged":  # models/lora.merged_tensors: W, B A, W + B A in fp32, the merged copy in dt
            sync["weight sync bucket + largest parameter merged (fp32)"] = bucket + max(V * h * (4 + dt),
                                                                                        h * i * (12 + dt))
        else:
            sync["weight sync bucket + largest full parameter"] = bucket + largest
        phases.append(PhasePlan("weight_sync", sync, overhead, dev))
    elif p.is_async:  # rank 0 broadcasts to the rollout workers (workers/weight_transfer.py)
        send = resident("weight_send")
        send["weight send: bucket, its packed copy, next full parameter"] = 2 * max(bucket, largest) + largest
        phases.append(PhasePlan("weight_send", send, overhead, dev))
    if p.share_devices:  # a replica's engine on this GPU too, awake in every phase (shared_gpu.py)
        from .shared_gpu import with_resident_engine

        replica_rows = max(1, p.batch.responses_per_step // max(1, p.rollout_workers))
        phases, shared = with_resident_engine(phases, cfg, shape, p.device, dev, dt, replica_rows, P,
                                              max(bucket, largest), max(1, p.replicas_per_device))
        notes = notes + shared
    return MemoryPlan(phases, dev, P, notes)

