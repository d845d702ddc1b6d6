"""Helpers for moving actor weights into a rollout engine, and for checking that they arrived.

``iter_buckets`` groups (name, tensor) pairs into lists of bounded byte size, so a sync never holds more
than about one bucket of full (gathered) tensors at a time. ``normalize_param_name`` strips the prefixes
that wrappers add to Hugging Face parameter names. ``sequence_logprobs_check`` compares an engine's
log-probs of a fixed token sequence with a reference model's: after a correct sync they agree to within
numerical noise; with stale weights they differ by orders of magnitude more.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, List, Sequence, Tuple

import torch

NamedTensor = Tuple[str, torch.Tensor]

WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
"""Name parts added by FSDP1, activation checkpointing and torch.compile, at any depth; vLLM knows none."""
LEADING_PREFIXES = ("module.",)
"""Name parts added at the front only (DDP); inside a name ``module.`` may be a real submodule."""


def tensor_nbytes(tensor: torch.Tensor) -> int:
    """Bytes the tensor's elements take (numel x element size), whatever its storage or device."""
    return tensor.numel() * tensor.element_size()


def normalize_param_name(name: str) -> str:
    """The plain Hugging Face name of a parameter: ``WRAPPER_PREFIXES`` removed wherever they occur and
    ``LEADING_PREFIXES`` at the front, e.g. ``_orig_mod.model._checkpoint_wrapped_module.layers.0.mlp.up_proj.weight``
    -> ``model.layers.0.mlp.up_proj.weight``."""
    for prefix in LEADING_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
    for prefix in WRAPPER_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
        name = name.replace("." + prefix, ".")
    return name


def iter_buckets(named_tensors: Iterable[NamedTensor], bucket_bytes: int) -> Iterator[List[NamedTensor]]:
    """Yield the (name, tensor) pairs in their input order, grouped into lists of at most ``bucket_bytes``.

    Tensors are never split (the engine's loaders need whole parameters): a tensor larger than
    ``bucket_bytes`` travels alone in a bucket of its own. The input is consumed lazily, so a generator
    that gathers one parameter at a time keeps at most one bucket alive.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: List[NamedTensor] = []
    filled = 0
    for name, tensor in named_tensors:
        size = tensor_nbytes(tensor)
        if bucket and filled + size > bucket_bytes:
            yield bucket
            bucket, filled = [], 0
        bucket.append((name, tensor))
        filled += size
    if bucket:
        yield bucket


@torch.no_grad()
def reference_sequence_logprobs(model: torch.nn.Module, token_ids: Sequence[int]) -> torch.Tensor:
    """log p(token_i | tokens before i) for i = 1 .. len-1 under a Hugging Face causal LM (float32, on CPU)."""
    if len(token_ids) < 2:
        raise ValueError("a log-prob check needs a sequence of at least 2 tokens")
    device = next(model.parameters()).device
    ids = torch.tensor([list(token_ids)], device=device)
    logits = model(input_ids=ids).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs.gather(-1, ids[0, 1:, None])[:, 0].cpu()


@dataclass
class LogprobDiff:
    """How far an engine's log-probs of a fixed sequence are from a reference model's."""

    max_abs: float
    """Largest |engine - reference| over the sequence's tokens (nats)."""
    mean_abs: float
    """Mean |engine - reference| over the sequence's tokens (nats)."""
    num_tokens: int
    """Tokens compared (sequence length - 1: the first token has no log-prob)."""

    def as_metrics(self, prefix: str = "weight_sync/logprob_diff") -> dict:
        """The numbers as a flat metrics dict (``<prefix>_max``, ``<prefix>_mean``)."""
        return {f"{prefix}_max": self.max_abs, f"{prefix}_mean": self.mean_abs}


def logprob_diff(engine_logprobs: Sequence[float], reference_logprobs: Sequence[float]) -> LogprobDiff:
    """Max and mean absolute difference of two equally long log-prob lists."""
    a = torch.as_tensor(list(engine_logprobs), dtype=torch.float64)
    b = torch.as_tensor(list(reference_logprobs), dtype=torch.float64)
    if a.shape != b.shape or a.numel() == 0:
        raise ValueError(f"log-prob lists must be equally long and non-empty, got {a.numel()} and {b.numel()}")
    diff = (a - b).abs()
    return LogprobDiff(max_abs=float(diff.max()), mean_abs=float(diff.mean()), num_tokens=int(a.numel()))


def sequence_logprobs_check(engine, reference_model: torch.nn.Module, token_ids: Sequence[int]) -> LogprobDiff:
    """Compare the engine's log-probs of ``token_ids[1:]`` given ``token_ids[0]`` (its
    ``sequence_logprobs(prompts, responses)``; vLLM's prompt log-probs) with the reference model's log-probs
    of the same tokens. Used after a weight sync (``rollout.check_weight_sync``)."""
    if len(token_ids) < 2:
        raise ValueError("a log-prob check needs a sequence of at least 2 tokens")
    engine_side = engine.sequence_logprobs([list(token_ids[:1])], [list(token_ids[1:])])[0]
    reference_side = reference_sequence_logprobs(reference_model, token_ids)
    return logprob_diff(engine_side, reference_side.tolist())


class AdapterNotInEngineError(RuntimeError):
    """After a LoRA sync the engine scores a fixed sequence as the base model does, not as the actor with its
    adapter: the adapter did not take effect (the run stops; docs/lora.md)."""


ADAPTER_SIGNAL = 10.0
"""The check decides only when the adapter moves the actor's log-probs at least this many times more than the engine
differs from the base (a clear signal over the engines' numerical noise)."""


def check_adapter_reached_engine(engine_logprobs: Sequence[float], actor_logprobs: Sequence[float],
                                 base_logprobs: Sequence[float]) -> dict:
    """A LoRA run's weight-sync check: ``weight_sync/adapter_effect_max`` (|actor - base|: what the adapter changes)
    and ``weight_sync/engine_vs_base_max``, next to the usual engine-vs-actor numbers. Raises
    ``AdapterNotInEngineError`` when the engine is plainly the base model: the adapter moves the log-probs more than
    ``ADAPTER_SIGNAL`` times the engine's distance to the base, and the engine is further from the actor than half
    the adapter's effect. With an adapter too small to tell (the first steps, B starts at 0) it decides nothing."""
    to_actor = logprob_diff(engine_logprobs, actor_logprobs).max_abs
    to_base = logprob_diff(engine_logprobs, base_logprobs).max_abs
    effect = logprob_diff(actor_logprobs, base_logprobs).max_abs
    if effect > ADAPTER_SIGNAL * to_base and to_actor > 0.5 * effect:
        raise AdapterNotInEngineError(
            f"weight sync: the LoRA adapter did not take effect in the rollout engine: its log-probs of the check "
            f"sequence are the base model's (max |engine - base| {to_base:.2e}) while the actor with its adapter "
            f"differs from the base by {effect:.2e} (max |engine - actor| {to_actor:.2e}). The engine is generating "
            "with stale weights; see docs/lora.md (\"When the adapter does not reach the engine\").")
    return {"weight_sync/adapter_effect_max": effect, "weight_sync/engine_vs_base_max": to_base}
