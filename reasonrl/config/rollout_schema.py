"""The ``rollout`` section: the engine that generates training and validation responses, how it samples, and how
weights reach it. One docstring per field; ``docs/configuration.md`` is generated from these with ``schema.py``
(``python -m reasonrl.config.docs``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PARTIAL_MODES = ("segments", "in_engine")
"""The values of ``rollout.partial_mode``."""


@dataclass
class RolloutConfig:
    engine: str = "auto"
    """Rollout engine: auto (vllm when it imports, else hf), vllm, hf."""
    n: int = 8
    """Samples per prompt (the GRPO group size)."""
    max_new_tokens: int = 512
    """Most tokens generated per response."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts; the trainer's log-probs and entropy are taken at it too (greedy,
    0, at 1)."""
    top_p: float = 1.0
    """Nucleus sampling mass for training rollouts."""
    top_k: int = -1
    """Top-k for training rollouts (-1: off)."""
    val_temperature: float = 0.0
    """Temperature for validation (0: greedy)."""
    gpu_memory_utilization: float = 0.5
    """vLLM on GPU: fraction of GPU memory for weights + KV cache. 0.5 fits a 1.5B model's actor (with its AdamW
    state), reference and vLLM on one 80 GB GPU; vLLM sleeps while the actor trains (rollout.free_cache_engine)."""
    enforce_eager: Optional[bool] = None
    """vLLM: skip CUDA-graph capture and compilation (faster start-up, slower decoding). None: true on CPU, false
    on GPU (CUDA graphs decoded 2.8x faster on an H200); the start-up table shows the value used."""
    kv_cache_gb: float = 2.0
    """vLLM on CPU: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    max_num_seqs: int = 0
    """vLLM scheduler: most sequences in one engine step (0: vLLM's default for the device, 1,024 on an H200). A
    like-for-like comparison sets it to the peer's value (TRL's colocated engine: its micro-batch rows x steps per
    generation)."""
    max_num_batched_tokens: int = 0
    """vLLM scheduler: most tokens (prefill chunks and decode) in one engine step (0: vLLM's default for the device,
    16,384 on an H200; TRL's colocated engine uses 4,096)."""
    free_cache_engine: bool = True
    """vLLM on GPU: sleep (free weights and KV cache) while the actor trains."""
    sleep_level: int = 0
    """vLLM on GPU, with ``free_cache_engine``: what sleep does with the engine's weights. 1: copies them to host
    memory and back at wake-up; 2: discards them (no host copy: the next sync refills every weight); 0 (auto): 2
    when every sync sends all the weights (full fine-tuning, or LoRA with ``actor.lora.merge_for_rollout``), 1
    for an adapter-only sync, which never sends the base weights (2 is refused there)."""
    weight_sync_bucket_mb: int = 256
    """Weight sync streams parameters in buckets of at most this many MiB."""
    check_weight_sync: bool = False
    """Debug: after each sync, compare the engine's log-probs of a fixed sequence with the actor's."""
    logprobs: Optional[bool] = None
    """Ask the engine for each sampled token's log-prob during training rollouts. Needed by the off-policy
    corrections (``algorithm.off_policy``) and for the rollout-vs-actor mismatch metrics (``rollout/logprob_diff_*``,
    ``offpolicy/*``); it costs generation speed (vLLM ran at half its throughput on an H200 with them). None (auto):
    on when ``algorithm.off_policy.correction`` is not none or ``check_weight_sync`` is on. Validation and evaluation
    never ask."""
    seed: int = 0
    """Engine seed (per-request seeds are not used: vLLM on CPU crashes with n>1 and a request seed)."""
    max_turns: int = 4
    """With ``tool.enabled``: most model turns per trajectory (a turn ends at a tool call or at the answer), so at
    most ``max_turns - 1`` tool calls. ``max_new_tokens`` bounds the whole trajectory, tool output included."""
    tensor_parallel_size: int = 1
    """vLLM: workers that share one rollout engine, sharded this many ways (tensor parallel, one shard in each
    worker's own process; vLLM's external-launcher executor). Must divide the workers; ranks r*T .. r*T+T-1 form
    one engine and get the same prompts. The model's attention and KV heads must divide by it. 1: every worker has
    a whole engine."""
    stream_chunk_prompts: int = 0
    """Rewards while generating: each worker generates its share of a training batch in sub-batches of this many
    prompts and the verifier pool starts on each sub-batch's responses as soon as it is done, so verification runs
    during generation (``timing_s/verify`` is then only the part left after the last response). 0: one generate
    call per step, verified after it. Small sub-batches cost generation throughput on a GPU (docs/async.md)."""
    partial: bool = False
    """Partial rollouts (``fleet.continuous``): a replica generates in segments of ``partial_segment_tokens`` and
    takes weights published meanwhile between two segments, so a response in flight continues under the new weights
    instead of waiting for or discarding them; every token records its weight version (docs/async.md)."""
    partial_segment_tokens: int = 64
    """With ``rollout.partial``: most new tokens per segment, so the longest a new weight version waits to reach
    the responses in flight (smaller: fresher tokens, more engine calls per response)."""
    partial_mode: str = "segments"
    """With ``rollout.partial``: how new weights reach the responses in flight. segments: engine calls of
    ``partial_segment_tokens`` new tokens, the weights loaded between two calls and each unfinished response continued
    from its prefix (any engine). in_engine: vLLM only; the requests stay in the engine (their KV cache kept) and the
    weights are loaded between two engine steps, so the next token already comes from them (vLLM's asynchronous
    scheduling is turned off for it). Not yet measured on a GPU (docs/async.md)."""
