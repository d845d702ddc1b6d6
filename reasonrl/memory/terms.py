"""The rule behind each term of the memory plan, one function per term (bytes; notation in ``reasonrl.memory``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from .shape import ModelShape

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


@dataclass(frozen=True)
class Trained:
    """What a run trains and keeps beside it, as both memory plans (device, host) count it."""

    P: int
    """The model's parameters."""
    Pa: int
    """LoRA's adapter parameters (0 without LoRA)."""
    has_ref: bool
    """A reference pass runs (``algorithm.use_kl_loss`` or ``kl_in_reward``)."""
    ref_bytes: int
    """Bytes per reference parameter (``ref.param_dtype``: 4 for float32, else the compute dtype's;
    ``workers/policy.reference_param_dtype`` is its torch twin)."""

    @property
    def lora(self) -> bool:
        return self.Pa > 0

    @property
    def trained(self) -> int:
        """The parameters the optimizer holds and the update's gradients cover (LoRA: the adapters)."""
        return self.Pa if self.lora else self.P

    @property
    def ref_copy(self) -> bool:
        """A separate reference model exists (with LoRA the reference is the actor with its adapters off)."""
        return self.has_ref and not self.lora


def trained_of(cfg: Any, shape: ModelShape, dt: int) -> Trained:
    """``Trained`` for this config and model; ``dt``: the compute dtype's bytes (``compute_dtype_bytes``)."""
    a = cfg.actor
    Pa = shape.lora_parameters(a.lora.rank, a.lora.target_modules) if a.lora.rank > 0 else 0
    return Trained(shape.parameter_count(), Pa, bool(cfg.algorithm.use_kl_loss or cfg.algorithm.kl_in_reward),
                   4 if cfg.ref.param_dtype == "float32" else dt)


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


def head_backward_bytes(shape: ModelShape, response_tokens: int, frozen_head: bool = False) -> float:
    """The fused head's backward peak: the float32 weight-gradient accumulator (4 V h) is alive throughout; per chunk
    either the bf16 logits and float32 probabilities (1.5 chunks) or, at the weight-gradient matmul, its bf16 result
    and float32 copy (6 V h) beside the bf16 gradient of the logits (0.5 chunk). ``frozen_head`` (LoRA: the head
    takes no gradient): the 1.5 chunks alone."""
    chunk, vh = head_chunk_bytes(shape, response_tokens), shape.vocab_size * shape.hidden_size
    if frozen_head:
        return 1.5 * chunk
    return max(1.5 * chunk + 4 * vh, 0.5 * chunk + 10 * vh)


def activation_bytes(cfg: Any, shape: ModelShape, tokens: int, dt: int, compiled: bool,
                     extra_per_token_layer: float = 0.0) -> float:
    """Saved activations of a micro-batch of N tokens for the backward. Without gradient checkpointing
    N x L x the per-layer bytes (``ModelShape.activation_bytes_per_token_layer`` + ``extra_per_token_layer``:
    LoRA's), x 0.71 with ``actor.compile`` (``COMPILE_ACTIVATION_RATIO``); with ``model.gradient_checkpointing``
    each layer keeps only its input (N h dt per layer) and one layer's activations exist again while it is
    recomputed."""
    per_layer = tokens * (shape.activation_bytes_per_token_layer(dt) + extra_per_token_layer)
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


ADAMW_STEP_LABELS = {"foreach": "foreach: every sqrt(v) at once", "for_loop": "for-loop: one parameter's sqrt(v)",
                     "fused": "fused: none"}
"""How the plan names the AdamW step's temporaries, per resolved ``actor.adamw_impl``."""


def adamw_step_bytes(impl: str, trained: int, largest: int, world_size: int) -> float:
    """The temporaries of AdamW's step beside the moments and gradients, for a resolved ``actor.adamw_impl``:

    - foreach (torch's default on CUDA) computes sqrt(v) for every parameter at once: a float32 copy of the second
      moments, 4 x trained / W. Measured: the 7B full fine-tune of benchmarks/results/s10_7b_full_params_on_gpu.json
      ran out of device memory in ``torch._foreach_sqrt`` with the update planned at 128.8 of 139.8 GiB (its
      activations and head, 9.7 GiB, are gone by then; the step adds 28.4);
    - for_loop: one parameter at a time, sqrt(v) and its quotient by the bias correction alive together: 8 x the
      largest trained parameter / W;
    - fused: none (the kernel updates the moments and parameters in place)."""
    if impl == "foreach":
        return 4 * trained / world_size
    if impl == "for_loop":
        return 8 * largest / world_size
    return 0.0


def packed_mask_bytes(cfg: Any, tokens: int) -> float:
    """``actor.use_packing`` with sdpa/eager attention: a dense N x N boolean mask over the packed row."""
    if cfg.actor.use_packing and cfg.model.attn_implementation in ("sdpa", "eager"):
        return float(tokens) * tokens
    return 0.0


def engine_terms(cfg: Any, shape: ModelShape, tensor_parallel_size: int, device: str, device_bytes: float, dt: int,
                 rows: int, P: int) -> Tuple[Dict[str, float], Dict[str, float], bool, List[str]]:
    """The rollout engine's terms while awake, those only while it generates, whether it sleeps during the update,
    and notes. vLLM on GPU takes ``rollout.gpu_memory_utilization`` x the device for its weights (P dt / T), its
    activations and CUDA graphs, and the KV cache (the rest; vLLM refuses to start when that cannot hold one sequence
    of 2 L kv dt / T bytes per token); with ``rollout.free_cache_engine`` it sleeps (weights to CPU, KV cache freed)
    from before the update until the weight sync. vLLM on CPU: weights + ``rollout.kv_cache_gb``, never asleep. The
    hf engine (``rollout.engine=hf``; ``auto`` is taken as vllm, what it resolves to where vLLM imports): a full dt
    copy of the weights, plus while generating the KV cache of all the worker's samples (``rows``). The same engine
    runs on an async rollout worker's device (``plan_rollout_worker``)."""
    notes: List[str] = []
    weights = P * dt / tensor_parallel_size
    kv_per_token = 2 * shape.num_layers * shape.kv_width * dt / tensor_parallel_size
    seq = cfg.data.max_prompt_length + max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)
    if cfg.rollout.engine == "hf":
        return {"engine weights (hf copy)": P * dt}, {"engine KV cache (hf generate)": rows * seq * kv_per_token}, \
            False, notes
    if device == "cpu":
        return {"engine weights": weights, "engine KV cache": cfg.rollout.kv_cache_gb * GIB}, {}, False, notes
    budget = cfg.rollout.gpu_memory_utilization * device_bytes
    cache = budget - weights
    if cache < seq * kv_per_token:
        notes.append(f"vLLM cannot start: rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} gives "
                     f"{budget / GIB:.1f} GiB, its weights take {weights / GIB:.1f} GiB and one sequence of {seq} "
                     f"tokens needs {seq * kv_per_token / GIB:.2f} GiB of KV cache")
    return {"engine weights": weights, "engine KV cache + workspace": max(cache, 0.0)}, {}, \
        cfg.rollout.free_cache_engine, notes

