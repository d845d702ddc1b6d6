"""Will it fit? The expected peak memory per GPU in each phase of a step, from the config and ``config.json`` alone.

Pure arithmetic (no torch, no CUDA): ``plan_memory`` turns a ``Config``, the model's ``config.json`` dict, the device's
memory in bytes and a ``Placement`` (world size, tensor-parallel size, critic or not) into a ``MemoryPlan``: for each
phase of a colocated step (rollout, old log-probs, reference, critic values, critic update, actor update, weight sync)
the terms that are on the device then, in bytes, their total and whether it fits. ``render_plan`` prints it as a
table; ``largest_fitting_token_budget`` and ``fit_suggestions`` say what would make a layout fit. Every term's rule is
in the docstring of the function that computes it; docs/performance.md ("Will it fit?") compares the plan with the
H200 runs in benchmarks/results/.

Notation: P parameters, W data-parallel ranks, T ranks per vLLM engine, h hidden size, i intermediate size, kv the
key/value width (kv heads x head dim), V vocabulary, L layers, dt bytes of the compute dtype (2 for bf16), N tokens in
one micro-batch's forward, c tokens of one log-prob chunk (``reasonrl/models/fused_logprob.py``).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

GIB = 1 << 30
LOGPROB_CHUNK_TOKENS = 2048
"""Tokens whose logits exist at once in the fused log-prob head (``response_log_probs``'s default chunk_size)."""
COMPILE_ACTIVATION_RATIO = 0.71
"""Measured: saved activations of a ``torch.compile``-d decoder layer (``actor.compile``) over the eager layer's. The
H200 update peaks of benchmarks/results/gpu_update_mfu.json grow by 19.66 GiB (compiled) and 27.73 GiB (eager) from 8
to 16 rows of 1280 tokens: 19.66 / 27.73 = 0.709 (Inductor recomputes pointwise ops instead of saving them)."""
CUDA_CONTEXT_BYTES = 1 * GIB
"""Measured: device memory a worker process holds outside torch's allocator (CUDA context, cuBLAS and NCCL
workspaces): device_used - reserved after start-up was 0.97 GiB in benchmarks/results/gpu_step_1p5b_n1.json."""

REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
PHASES = ("rollout", "log_probs", "reference", "values", "critic_update", "update", "weight_sync")


@dataclass(frozen=True)
class Placement:
    """Where the step runs: how many ranks, how the engine is sharded, whether a critic shares each GPU."""

    world_size: int = 1
    """Data-parallel actor ranks, one GPU each (FSDP2 shards the models over all of them)."""
    tensor_parallel_size: int = 1
    """Ranks per vLLM engine (``rollout.tensor_parallel_size``): each GPU holds 1/T of the engine's weights."""
    critic: bool = False
    """A PPO critic process on every actor GPU (``algorithm.adv_estimator=gae``)."""
    device: str = "cuda"
    """cuda (vLLM sleeps while the actor trains) or cpu (host memory; vLLM's KV cache is ``rollout.kv_cache_gb``)."""


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a Llama-family ``config.json`` (Llama, Qwen2, Mistral, SmolLM) that the plan needs."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    mlp_bias: bool = False

    @classmethod
    def from_config_json(cls, config: Mapping[str, Any]) -> "ModelShape":
        """Read the shape; ValueError naming every missing or non-integer field. ``num_key_value_heads`` defaults to
        the attention heads, ``head_dim`` to hidden / heads, ``tie_word_embeddings`` to False; q/k/v carry biases for
        ``model_type`` qwen2 or when ``attention_bias`` is true."""
        if not isinstance(config, Mapping):
            raise ValueError(f"the model config must be a dict (config.json), got {type(config).__name__}")
        missing = [k for k in REQUIRED_FIELDS if k not in config]
        if missing:
            raise ValueError(f"the model's config.json lacks {', '.join(missing)}: the memory plan needs "
                             f"{', '.join(REQUIRED_FIELDS)}")
        values = {k: config[k] for k in REQUIRED_FIELDS}
        values["num_key_value_heads"] = config.get("num_key_value_heads") or config["num_attention_heads"]
        bad = [k for k, v in values.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
        if bad:
            raise ValueError("config.json fields must be positive integers: "
                             + ", ".join(f"{k}={values[k]!r}" for k in bad))
        heads = values["num_attention_heads"]
        head_dim = config.get("head_dim") or values["hidden_size"] // heads
        return cls(hidden_size=values["hidden_size"], intermediate_size=values["intermediate_size"],
                   num_layers=values["num_hidden_layers"], num_heads=heads,
                   num_kv_heads=values["num_key_value_heads"], head_dim=int(head_dim),
                   vocab_size=values["vocab_size"], tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                   qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)),
                   mlp_bias=bool(config.get("mlp_bias", False)))

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_parameters(self) -> int:
        """One decoder layer: q and o (h x heads*head_dim), k and v (h x kv), gate/up/down (3 h i), two RMSNorms
        (2h), plus biases where the config has them."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.kv_width, self.intermediate_size
        attention = 2 * h * q + 2 * h * kv + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
        return attention + mlp + 2 * h

    def root_parameters(self) -> int:
        """What is not in a decoder layer (FSDP2's root unit): the embedding (V h), the final norm (h) and an untied
        LM head (V h)."""
        embed = self.vocab_size * self.hidden_size
        return embed + self.hidden_size + (0 if self.tied_embeddings else embed)

    def parameter_count(self) -> int:
        """P = L x layer parameters + root parameters (tied embeddings counted once)."""
        return self.num_layers * self.layer_parameters() + self.root_parameters()

    def critic_parameter_count(self) -> int:
        """The value model: the backbone (P without an untied LM head) plus the value head (h + 1)."""
        head = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return self.parameter_count() - head + self.hidden_size + 1

    def activation_bytes_per_token_layer(self, dt: int) -> float:
        """Saved activations of one eager decoder layer per token (HF Llama/Qwen2, sdpa/flash attention): the two
        RMSNorms keep their float32 input (2 x 4h); six h-wide tensors in dt (each norm's normalised input and
        output, the attention's query and output), 5 kv (keys, values), four i-wide ones of the MLP (gate, SiLU(gate),
        up, their product: 8i at bf16) and the attention's float32 log-sum-exp per head. Counted on the real
        transformers layer with saved-tensor hooks in tests/test_memory_plan.py."""
        h, kv, i = self.hidden_size, self.kv_width, self.intermediate_size
        return 8 * h + (12 * h + 5 * kv + 8 * i) * dt / 2 + 4 * self.num_heads


@dataclass
class PhasePlan:
    """One phase: the terms on the device (name -> bytes), the process overhead, and the device's size."""

    name: str
    terms: Dict[str, float]
    overhead: float
    device_bytes: float

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
        return self.total <= self.device_bytes


@dataclass
class MemoryPlan:
    """Every phase of one step on one GPU (``phases`` in step order; a phase the config never runs is absent)."""

    phases: List[PhasePlan]
    device_bytes: float
    parameters: int
    notes: List[str] = field(default_factory=list)

    def phase(self, name: str) -> PhasePlan:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase {name!r} in this plan (phases: {', '.join(p.name for p in self.phases)})")

    @property
    def peak(self) -> PhasePlan:
        return max(self.phases, key=lambda p: p.total)

    @property
    def fits(self) -> bool:
        """Every phase fits and nothing else refuses the layout (``notes`` says why not)."""
        return all(p.fits for p in self.phases) and not self.notes


def _positive_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of bytes, got {value!r}")
    return float(value)


def _check_placement(placement: Placement, shape: ModelShape) -> None:
    w, t = placement.world_size, placement.tensor_parallel_size
    for name, v in (("world_size", w), ("tensor_parallel_size", t)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"placement.{name} must be a positive integer, got {v!r}")
    if w % t:
        raise ValueError(f"placement.tensor_parallel_size={t} must divide world_size={w}")
    if shape.num_heads % t or shape.num_kv_heads % t:
        raise ValueError(f"tensor_parallel_size={t} must divide the attention heads ({shape.num_heads}) and KV heads "
                         f"({shape.num_kv_heads})")
    if placement.device not in ("cuda", "cpu"):
        raise ValueError(f"placement.device must be cuda or cpu, got {placement.device!r}")


def compute_dtype_bytes(cfg: Any, device: str) -> int:
    """``model.dtype``: bfloat16 -> 2, float32 -> 4, auto -> 2 on cuda, 4 on cpu (``models.torch_dtype``)."""
    d = cfg.model.dtype
    if d == "auto":
        return 2 if device == "cuda" else 4
    if d in ("bfloat16", "float16"):
        return 2
    if d == "float32":
        return 4
    raise ValueError(f"model.dtype={d!r}: the memory plan knows auto, bfloat16, float16, float32")


def micro_batch_tokens(cfg: Any, rows_available: int, budget: int) -> Tuple[int, int]:
    """(N, response tokens) of the largest forward: with a token budget (``*.max_tokens_per_micro_batch``) N is the
    budget, or one longest row when the budget is smaller (a row runs alone); otherwise
    ``actor.micro_batch_size_per_worker`` rows of the longest length (max_prompt_length + max_new_tokens: a padded
    micro-batch is as wide as its longest row). Never more than the rows the worker has."""
    seq = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    resp_share = cfg.rollout.max_new_tokens / seq
    if budget > 0:
        tokens = min(max(budget, seq), rows_available * seq)
        return tokens, int(tokens * resp_share)
    rows = max(1, min(cfg.actor.micro_batch_size_per_worker, rows_available))
    return rows * seq, rows * cfg.rollout.max_new_tokens


def head_chunk_bytes(shape: ModelShape, response_tokens: int) -> float:
    """One float32 block of logits: c x V x 4, c = min(2048, the micro-batch's response tokens)."""
    return min(LOGPROB_CHUNK_TOKENS, max(1, response_tokens)) * shape.vocab_size * 4


def head_forward_bytes(shape: ModelShape, response_tokens: int, with_entropy: bool) -> float:
    """The fused head's forward peak (no grad or not): the float32 logits of a chunk and logsumexp's shifted
    exponentials (2 chunks); with entropy also the softmax and the batched dot product's operand copy (3 chunks;
    measured 2.1 and 3.2 chunks on the H200: benchmarks/results/gpu_step_1p5b_n1.json's reference pass,
    gpu_update_mfu.json's old-log-prob pass)."""
    return (3 if with_entropy else 2) * head_chunk_bytes(shape, response_tokens)


def head_backward_bytes(shape: ModelShape, response_tokens: int) -> float:
    """The fused head's backward peak: the float32 weight-gradient accumulator (4 V h) is alive throughout; per chunk
    either the bf16 logits and float32 probabilities (1.5 chunks) or, at the weight-gradient matmul, its bf16 result
    and float32 copy (6 V h) beside the bf16 gradient of the logits (0.5 chunk)."""
    chunk, vh = head_chunk_bytes(shape, response_tokens), shape.vocab_size * shape.hidden_size
    return max(1.5 * chunk + 4 * vh, 0.5 * chunk + 10 * vh)


def activation_bytes(cfg: Any, shape: ModelShape, tokens: int, dt: int, compiled: bool) -> float:
    """Saved activations of a micro-batch of N tokens for the backward. Without gradient checkpointing
    N x L x the per-layer bytes (``ModelShape.activation_bytes_per_token_layer``), x 0.71 with ``actor.compile``
    (``COMPILE_ACTIVATION_RATIO``); with ``model.gradient_checkpointing`` each layer keeps only its input (N h dt
    per layer) and one layer's activations exist again while it is recomputed."""
    per_layer = tokens * shape.activation_bytes_per_token_layer(dt)
    if cfg.model.gradient_checkpointing:
        return shape.num_layers * tokens * shape.hidden_size * dt + per_layer
    return shape.num_layers * per_layer * (COMPILE_ACTIVATION_RATIO if compiled else 1.0)


def no_grad_forward_bytes(shape: ModelShape, tokens: int, response_tokens: int, dt: int, head: bool,
                          with_entropy: bool) -> float:
    """A no-grad forward's peak beyond the weights: the residual stream and the current hidden states (2 N h dt)
    plus the larger of one MLP's temporaries (gate, up and SiLU(gate): 3 N i dt) and the head's chunk
    (``head_forward_bytes``; a value head has none)."""
    mlp = 3 * tokens * shape.intermediate_size * dt
    top = head_forward_bytes(shape, response_tokens, with_entropy) if head else 0.0
    return 2 * tokens * shape.hidden_size * dt + max(mlp, top)


def _packed_mask_bytes(cfg: Any, tokens: int) -> float:
    """``actor.use_packing`` with sdpa/eager attention: a dense N x N boolean mask over the packed row."""
    if cfg.actor.use_packing and cfg.model.attn_implementation in ("sdpa", "eager"):
        return float(tokens) * tokens
    return 0.0


def _engine_terms(cfg: Any, shape: ModelShape, p: Placement, device_bytes: float, dt: int, rows: int,
                  P: int) -> Tuple[Dict[str, float], Dict[str, float], bool, List[str]]:
    """The rollout engine's terms while awake, those only while it generates, whether it sleeps during the update,
    and notes. vLLM on GPU takes
    ``rollout.gpu_memory_utilization`` x the device for weights (P dt / T), its activations and CUDA graphs, and the
    KV cache (the rest); with ``rollout.free_cache_engine`` it sleeps (weights to CPU, KV cache freed) from before the
    update until the weight sync. vLLM on CPU: weights + ``rollout.kv_cache_gb``, never asleep. The hf engine: a
    full dt copy of the weights, plus while generating the KV cache of all the worker's samples
    (2 L kv dt per token)."""
    notes: List[str] = []
    if cfg.trainer.mode == "async":
        return {}, {}, False, notes
    weights = P * dt / p.tensor_parallel_size
    kv_per_token = 2 * shape.num_layers * shape.kv_width * dt / p.tensor_parallel_size
    seq = cfg.data.max_prompt_length + max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)
    if cfg.rollout.engine == "hf":
        return {"engine weights (hf copy)": P * dt}, {"engine KV cache (hf generate)": rows * seq * kv_per_token}, \
            False, notes
    if p.device == "cpu":
        return {"engine weights": weights, "engine KV cache": cfg.rollout.kv_cache_gb * GIB}, {}, False, notes
    budget = cfg.rollout.gpu_memory_utilization * device_bytes
    cache = budget - weights
    if cache < seq * kv_per_token:
        notes.append(f"vLLM cannot start: rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} gives "
                     f"{budget / GIB:.1f} GiB, its weights take {weights / GIB:.1f} GiB and one sequence of {seq} "
                     f"tokens needs {seq * kv_per_token / GIB:.2f} GiB of KV cache")
    return {"engine weights": weights, "engine KV cache + workspace": max(cache, 0.0)}, {}, \
        cfg.rollout.free_cache_engine, notes


def plan_memory(cfg: Any, model_config: Mapping[str, Any], device_bytes: Any,
                placement: Optional[Placement] = None, old_log_prob_pass: Optional[bool] = None) -> MemoryPlan:
    """The expected peak memory per GPU in each phase of one colocated step (see the module docstring).
    ``old_log_prob_pass``: None decides as the trainer does (``reasonrl.trainer.passes``); True/False forces it (a
    benchmark's ``--old-log-prob-pass always``). The plan is the steady state: AdamW moments exist (from the first
    optimizer step on) and the reference's root is unsharded (from its first forward on).

    Resident terms: the actor's fp32 shards (4P/W) and AdamW moments (8P/W), the reference's fp32 shards (4P/W) and
    its FSDP root, kept unsharded in dt after its forward (V h (x2 untied) + h); offload
    (``actor.offload_params``/``offload_optimizer``, ``ref.offload_params``, ``critic.offload_*``) keeps a term
    only in the phases that use it. The update adds fp32 gradients (4P/W), the actor's unsharded root, two FSDP
    layers in flight (gathered in dt, reduced in fp32), the saved activations and the head's backward or forward,
    whichever is larger. The weight sync holds the engine's weights, one bucket (``rollout.weight_sync_bucket_mb``)
    and the largest full parameter before the KV cache wakes."""
    p = placement or Placement()
    shape = ModelShape.from_config_json(model_config)
    _check_placement(p, shape)
    dev = _positive_number(device_bytes, "device_bytes")
    dt = compute_dtype_bytes(cfg, p.device)
    P, W = shape.parameter_count(), p.world_size
    from reasonrl.trainer.passes import passes_needed

    passes = passes_needed(cfg)
    rows = max(1, cfg.data.train_batch_size * cfg.rollout.n // W)
    mini_rows = max(1, (cfg.actor.ppo_mini_batch_size or cfg.data.train_batch_size) * cfg.rollout.n // W)
    engine, generating, sleeps, notes = _engine_terms(cfg, shape, p, dev, dt, rows, P)
    has_ref = cfg.algorithm.use_kl_loss or cfg.algorithm.kl_in_reward
    a = cfg.actor
    root = shape.root_parameters() * dt
    layer_gather = 2 * shape.layer_parameters() * dt
    overhead = CUDA_CONTEXT_BYTES * (2 if p.critic else 1) if p.device == "cuda" else 0.0

    def resident(phase: str) -> Dict[str, float]:
        t: Dict[str, float] = {}
        if not a.offload_params or phase in ("log_probs", "update"):
            t["actor weights (fp32 shards)"] = 4 * P / W
        if not a.offload_optimizer or phase == "update":
            t["actor AdamW moments (2 x fp32)"] = 8 * P / W
        if has_ref and (not cfg.ref.offload_params or phase == "reference"):
            t["reference weights (fp32 shards)"] = 4 * P / W
            t["reference root (unsharded, dt)"] = root
        if p.critic:
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
        if _packed_mask_bytes(cfg, tokens):
            t["packed attention mask (N x N)"] = _packed_mask_bytes(cfg, tokens)
        return PhasePlan(phase, t, overhead, dev)

    def training_pass(phase: str, budget: int, Pm: int, label: str, head: bool, entropy: bool,
                      compiled: bool) -> PhasePlan:
        tokens, resp = micro_batch_tokens(cfg, mini_rows, budget)
        t = {**resident(phase), **({} if sleeps else awake()),
             f"{label} gradients (fp32 shards)": 4 * Pm / W, f"{label} root (unsharded, dt)": root,
             "FSDP layers in flight (2 x dt gathered, 2 x fp32 reduced)": 2 * shape.layer_parameters() * (dt + 4),
             f"activations ({tokens} tokens{', checkpointed' if cfg.model.gradient_checkpointing else ''})":
                 activation_bytes(cfg, shape, tokens, dt, compiled)}
        if head:
            t["log-prob head (chunk of logits)"] = max(head_backward_bytes(shape, resp),
                                                       head_forward_bytes(shape, resp, entropy))
        if _packed_mask_bytes(cfg, tokens):
            t["packed attention mask (N x N)"] = _packed_mask_bytes(cfg, tokens)
        return PhasePlan(phase, t, overhead, dev)

    phases = [PhasePlan("rollout", {**resident("rollout"), **awake(), **generating}, overhead, dev)]
    old_pass = passes.old_log_probs if old_log_prob_pass is None else bool(old_log_prob_pass)
    if old_pass:
        phases.append(forward_pass("log_probs", a.max_tokens_per_micro_batch, True, True, "actor"))
    if has_ref:
        phases.append(forward_pass("reference", cfg.ref.max_tokens_per_micro_batch or a.max_tokens_per_micro_batch,
                                   True, False, "reference"))
    if p.critic:
        budget = cfg.critic.max_tokens_per_micro_batch or a.max_tokens_per_micro_batch
        phases.append(forward_pass("values", budget, False, False, "critic"))
        phases.append(training_pass("critic_update", budget, shape.critic_parameter_count(), "critic", False, False,
                                    False))
    own_old = not old_pass
    phases.append(training_pass("update", a.max_tokens_per_micro_batch, P, "actor", True,
                                own_old or cfg.algorithm.entropy_coef != 0, a.compile))
    if engine:
        largest = max(shape.vocab_size * shape.hidden_size, shape.hidden_size * shape.intermediate_size) * dt
        sync = {**resident("weight_sync"), **awake()}
        sync["weight sync bucket + largest full parameter"] = cfg.rollout.weight_sync_bucket_mb * 2**20 + largest
        phases.append(PhasePlan("weight_sync", sync, overhead, dev))
    return MemoryPlan(phases, dev, P, notes)


def render_plan(plan: MemoryPlan) -> str:
    """The plan as a text table: one row per term, one column per phase, GiB; then totals and fits."""
    names = [p.name for p in plan.phases]
    terms: List[str] = []
    for p in plan.phases:
        terms += [t for t in p.terms if t not in terms]
    width = max(len(t) for t in terms + ["CUDA context (per process)"]) + 2
    cols = max(12, *(len(n) + 2 for n in names))
    lines = [f"memory plan per GPU (GiB of {plan.device_bytes / GIB:.1f}), {plan.parameters / 1e9:.2f}B parameters",
             "".ljust(width) + "".join(n.rjust(cols) for n in names)]
    for t in terms:
        cells = [f"{p.terms[t] / GIB:.2f}" if t in p.terms else "-" for p in plan.phases]
        lines.append(t.ljust(width) + "".join(c.rjust(cols) for c in cells))
    lines.append("CUDA context (per process)".ljust(width) + "".join(f"{p.overhead / GIB:.2f}".rjust(cols)
                                                                   for p in plan.phases))
    lines.append("total".ljust(width) + "".join(f"{p.total / GIB:.2f}".rjust(cols) for p in plan.phases))
    lines.append("fits".ljust(width) + "".join(("yes" if p.fits else "NO").rjust(cols) for p in plan.phases))
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _with(cfg: Any, section: str, **changes: Any) -> Any:
    return replace(cfg, **{section: replace(getattr(cfg, section), **changes)})


def largest_fitting_token_budget(cfg: Any, model_config: Mapping[str, Any], device_bytes: Any,
                                 placement: Optional[Placement] = None, step: int = 256) -> int:
    """The largest ``actor.max_tokens_per_micro_batch`` (a multiple of ``step``, at least one longest row) with which
    every phase fits, the other settings unchanged; 0 when even one row per micro-batch does not fit."""
    seq = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    rows = max(1, cfg.data.train_batch_size * cfg.rollout.n // (placement or Placement()).world_size)

    def fits(budget: int) -> bool:
        trial = _with(cfg, "actor", max_tokens_per_micro_batch=budget)
        return plan_memory(trial, model_config, device_bytes, placement).fits

    low = -(-seq // step) * step
    if not fits(low):
        return 0
    high = max(low, -(-rows * seq // step) * step)
    if fits(high):
        return high
    while high - low > step:  # fits(low), not fits(high)
        mid = (low + high) // 2 // step * step
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def fit_suggestions(cfg: Any, model_config: Mapping[str, Any], device_bytes: Any,
                    placement: Optional[Placement] = None) -> List[str]:
    """What would make an over-full layout fit, each change tried alone: a token budget, gradient checkpointing,
    offloading the optimizer / actor / reference, a lower engine share. Empty when it fits already."""
    plan = plan_memory(cfg, model_config, device_bytes, placement)
    if plan.fits:
        return []
    out: List[str] = []
    budget = largest_fitting_token_budget(cfg, model_config, device_bytes, placement)
    if budget:
        out.append(f"actor.max_tokens_per_micro_batch={budget}")
    trials = [("model.gradient_checkpointing=true", "model", {"gradient_checkpointing": True}),
              ("actor.offload_optimizer=true", "actor", {"offload_optimizer": True}),
              ("actor.offload_params=true", "actor", {"offload_params": True}),
              ("ref.offload_params=true", "ref", {"offload_params": True})]
    for text, section, change in trials:
        if not getattr(getattr(cfg, section), next(iter(change))):
            if plan_memory(_with(cfg, section, **change), model_config, device_bytes, placement).fits:
                out.append(text)
    util = cfg.rollout.gpu_memory_utilization
    for lower in (0.4, 0.3, 0.2):
        if lower < util and plan_memory(_with(cfg, "rollout", gpu_memory_utilization=lower), model_config,
                                        device_bytes, placement).fits:
            out.append(f"rollout.gpu_memory_utilization={lower}")
            break
    return out
