"""The RolloutEngine seam: token ids in; token ids, text, per-token log-probs and finish reason out."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import FrozenSet, Iterable, List, Optional, Protocol, Tuple, runtime_checkable

import torch


@dataclass
class SamplingParams:
    """How to sample; one object per generate call."""

    n: int = 1
    """Samples per prompt."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Keep only the top-k tokens (-1: off)."""
    max_new_tokens: int = 256
    """Most tokens generated per sample."""
    stop_token_ids: List[int] = field(default_factory=list)
    """Extra token ids that end a sample (EOS always does, unless ``ignore_eos``)."""
    ignore_eos: bool = False
    """Generate exactly ``max_new_tokens`` (benchmarks)."""
    seed: Optional[int] = None
    """Seed for this call (engines that cannot seed per call seed at start-up instead)."""
    stop: List[str] = field(default_factory=list)
    """Strings that end a sample once its decoded text contains one (tool calls end at a closing code fence). The
    sample's token ids run up to and including the token that completes the string; nothing after it is kept."""
    logprobs: bool = True
    """Return each sampled token's log-prob (``Completion.logprobs``; empty when off). Asking vLLM for them
    halved its throughput on an H200 (benchmarks/results/gpu_anchors.json), so callers that do not use them
    (validation, evaluation, training without TIS) turn them off."""


@dataclass
class Completion:
    """One sampled response."""

    token_ids: List[int]
    """Generated token ids (the stop token included when generation stopped on one)."""
    text: str
    """Decoded response text (special tokens skipped)."""
    logprobs: List[float]
    """Log-probability of each generated token under the distribution it was sampled from (at the sampling
    temperature; vLLM also includes the top-p/top-k renormalisation, the hf engine does not); empty when the call
    asked for none (``SamplingParams.logprobs``)."""
    finish_reason: str
    """"stop" (EOS or a stop token) or "length" (hit ``max_new_tokens``)."""


class StepCounter:
    """An engine's steps in all (each decode step of every generation: ``LLMEngine.step`` for vLLM; for the hf
    engine a token of ``generate`` and a micro-batch of its log-prob pass), read from another thread while a long
    call runs: a fleet replica's heartbeat (``reasonrl.fleet.progress``)."""

    def __init__(self) -> None:
        self.count = 0


def count_steps(llm_engine) -> StepCounter:
    """A counter of ``llm_engine.step()`` calls, however they are made (``LLM.generate`` and the step loops)."""
    counter, step = StepCounter(), llm_engine.step

    def counted(*args, **kwargs):
        out = step(*args, **kwargs)
        counter.count += 1
        return out

    llm_engine.step = counted
    return counter


SLEEP_PARTS = ("weights", "kv_cache")
"""What an engine's ``sleep`` frees and ``wake_up`` takes tags of."""


@runtime_checkable
class RolloutEngine(Protocol):
    """A generator colocated with the actor in the worker's process: everything a worker (or the evaluator, the
    weight-sync check, a tool-use loop) may call. Implementations: ``HFRolloutEngine`` (hf_engine.py) and
    ``VLLMRolloutEngine`` (vllm_engine.py).

    Sleep and wake: the engine owns its memory state (``asleep_parts``); the worker decides when to change it
    (``ActorRolloutRefWorker.sleep_engine`` / ``wake_engine`` / ``sync_weights``, called by the trainer). An engine
    never wakes itself: ``generate`` and ``sequence_logprobs`` on a sleeping engine raise. An engine without a sleep
    mode (``supports_sleep`` False) treats ``sleep``/``wake_up`` as no-ops and is never asleep.

    Weight updates: one sync is any number of ``update_weights`` calls (buckets), then ``finish_weight_update``.
    """

    name: str
    """"hf" or "vllm" (reported by the worker's ``info``)."""
    supports_sleep: bool
    """Whether ``sleep`` frees memory (vLLM on GPU with ``rollout.free_cache_engine``)."""

    @property
    def asleep_parts(self) -> FrozenSet[str]:
        """What ``sleep`` freed and ``wake_up`` has not yet restored (a subset of ``SLEEP_PARTS``)."""
        ...

    def generate(self, prompt_token_ids: List[List[int]], sampling: SamplingParams) -> List[List[Completion]]:
        """For each prompt, ``sampling.n`` completions, in prompt order."""
        ...

    def sequence_logprobs(self, prompts: List[List[int]], responses: List[List[int]]) -> List[List[float]]:
        """Log-probability (temperature 1) of each response token given its prompt, by the engine's own model
        (the weight-sync check compares these with the actor's)."""
        ...

    def update_weights(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Load new weights (Hugging Face parameter names, full tensors); may be called with buckets."""
        ...

    def finish_weight_update(self) -> None:
        """End one sync (after its last ``update_weights``): the engine is ready to generate with the new weights.
        Harmless to call twice or with no sync pending."""
        ...

    def load_adapter(self, named_tensors: Iterable[Tuple[str, torch.Tensor]], adapter_config: dict) -> None:
        """Serve the base model with this LoRA adapter from the next ``generate`` on (``actor.lora``, adapter-only
        sync): the adapter's tensors (PEFT names) and its PEFT config."""
        ...

    def sleep(self) -> None:
        """Free weights and KV cache while the actor trains (no-op where unsupported)."""
        ...

    def wake_up(self, tags: Optional[List[str]] = None) -> None:
        """Re-allocate what ``sleep`` freed: ``tags`` picks "weights" and/or "kv_cache" (None: both), so a sync
        can wake the weights first and the KV cache after."""
        ...

    def shutdown(self) -> None:
        """Release the engine's memory (tests and benchmarks that start another engine in the same process)."""
        ...
