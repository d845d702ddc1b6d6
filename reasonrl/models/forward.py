"""Teacher-forced forward passes over (prompt + response) rows: per-token log-probs and entropy.

Two paths give the same numbers:
- fused (the default): the model's own forward runs with its LM head swapped, for that call, for a function that
  takes the hidden states at the positions that predict the response tokens and computes log-probs and entropy
  through the head's weight in chunks (``fused_logprob.linear_log_probs``); no [tokens x vocab] logits tensor is
  ever materialised, and prompt positions never reach the head. Going through the model's forward keeps FSDP2's
  hooks in charge (the head's weight is unsharded for the call; its gradient, tied embeddings included, is
  reduce-scattered as usual).
- full logits: the model's forward over every position, then log-softmax of the response positions' logits. Used
  for models whose head is not a plain bias-free ``nn.Linear`` applied last (soft-capped or scaled logits, custom
  heads), or when asked for (``fused=False``; ``REASONRL_FUSED_LOGPROBS=0`` flips the default).

``packed_response_log_probs`` gives the same numbers from a padding-free packed micro-batch
(``reasonrl.data.packing``): one row of valid tokens, ``attention_mask=None`` and per-sequence position ids, so the
model's mask builder makes the attention block-diagonal; the fused head then sees only the response positions
(``logits_to_keep`` as an index tensor).

Every function takes ``temperature``: the log-probs and entropy are those of softmax(logits / temperature), the
distribution a rollout at that temperature samples from (the logits are divided in float32, as vLLM's sampler
does). The trainer passes ``training_temperature(cfg.rollout.temperature)``: greedy rollouts (temperature 0) are
scored at 1. See docs/algorithms.md, "Sampling temperature and the log-probs".
"""
from __future__ import annotations

import contextlib
import inspect
import math
import os
from typing import Callable, Iterator, Optional, Tuple

import torch
from torch import nn

from reasonrl.algorithms.logprob import entropy_from_logits, log_probs_from_logits
from reasonrl.data.packing import PackedRows, pack_rows, trimmed_columns
from reasonrl.models.fused_logprob import linear_log_probs

FUSED_BY_DEFAULT = os.environ.get("REASONRL_FUSED_LOGPROBS", "1").lower() not in ("0", "false", "no")
"""Whether ``response_log_probs`` takes the fused path when its ``fused`` argument is None."""

# Config fields of Hugging Face models that transform the LM head's output (soft-capping, scaling): such models keep
# the full-logits path, since the fused path assumes log-probs of exactly ``hidden @ lm_head.weight^T``.
LOGIT_TRANSFORM_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def training_temperature(rollout_temperature: float) -> float:
    """The temperature the training side (old, actor, reference log-probs and entropy) scores responses at: the
    rollout's sampling temperature, except that greedy decoding (``rollout_temperature <= 0``) has no temperature
    to divide by and is scored at 1, the model's own distribution (what vLLM reports for greedy samples too)."""
    return float(rollout_temperature) if rollout_temperature > 0 else 1.0


def _checked_temperature(temperature: float) -> float:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r} (a greedy rollout, "
                         f"temperature 0, is scored at 1: use training_temperature)")
    return float(temperature)


def _scaled_log_probs(logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool,
                      chunk_size: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs of ``labels`` [b, K] (and entropy) under softmax(``logits`` [b, K, V] / temperature), float32.
    At a temperature other than 1 the float32 division runs ``chunk_size`` (b, k) rows at a time, so at most one
    chunk of scaled logits exists at once outside autograd (under it the chunks backward needs are kept)."""
    if temperature == 1.0:
        log_probs = log_probs_from_logits(logits, labels, chunk_size=chunk_size)
        return log_probs, (entropy_from_logits(logits, chunk_size=chunk_size) if with_entropy else None)
    flat, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    rows = flat.shape[0]
    step = max(chunk_size if chunk_size > 0 else rows, 1)
    lp_parts, ent_parts = [], []
    for start in range(0, max(rows, 1), step):  # no rows: one empty chunk, so the results keep their shape
        scaled = flat[start:start + step].float() / temperature
        lp_parts.append(log_probs_from_logits(scaled, flat_labels[start:start + step]))
        if with_entropy:
            ent_parts.append(entropy_from_logits(scaled))
    log_probs = torch.cat(lp_parts).reshape(labels.shape)
    return log_probs, (torch.cat(ent_parts).reshape(labels.shape) if with_entropy else None)


def fused_lm_head(model) -> Optional[nn.Linear]:
    """The model's LM head when the fused path applies to it (a bias-free ``nn.Linear`` whose output is the logits,
    and a forward that accepts ``logits_to_keep``); None otherwise."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, nn.Linear) or head.bias is not None:
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) is not None for name in LOGIT_TRANSFORM_FIELDS):
        return None
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft passes kwargs through
    if "logits_to_keep" not in inspect.signature(inner.forward).parameters:
        return None
    return head


@contextlib.contextmanager
def _head_forward_replaced(head: nn.Module, forward: Callable) -> Iterator[None]:
    """Call ``forward`` instead of ``head.forward`` inside the block (hooks and parameters stay in place)."""
    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # back to the class's forward


def _fused_log_probs(model, head: nn.Linear, labels: torch.Tensor, keep, with_entropy: bool, chunk_size: int,
                     temperature: float, **inputs):
    """The model's forward with ``logits_to_keep=keep``; its head turns the kept hidden states' first
    ``labels.shape[1]`` positions into log-probs of ``labels`` [b, K] (and entropy) at ``temperature``."""
    width = labels.shape[1]

    def head_to_log_probs(hidden: torch.Tensor) -> torch.Tensor:
        log_probs, entropy = linear_log_probs(hidden[:, :width], head.weight, labels, chunk_size, with_entropy,
                                              temperature)
        # A new tensor, not a view: FSDP2 hooks the root's output for backward (and warns about views).
        return torch.stack([log_probs, entropy] if with_entropy else [log_probs], dim=-1)

    with _head_forward_replaced(head, head_to_log_probs):
        out = model(**inputs, use_cache=False, logits_to_keep=keep).logits
    return out[..., 0], (out[..., 1] if with_entropy else None)


def _fused_response_log_probs(model, head: nn.Linear, input_ids, attention_mask, position_ids, responses,
                              with_entropy: bool, chunk_size: int, temperature: float):
    # The last width + 1 positions are kept; the first width of them predict the response.
    return _fused_log_probs(model, head, responses, responses.shape[1] + 1, with_entropy, chunk_size, temperature,
                            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


def response_log_probs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                       responses: torch.Tensor, with_entropy: bool = False, chunk_size: int = 2048,
                       fused: Optional[bool] = None, temperature: float = 1.0
                       ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs [b, T] of ``responses`` (the last T columns of ``input_ids``) and, optionally, the entropy [b, T]
    of the model's next-token distribution at each response position, float32.

    ``chunk_size``: tokens whose logits are computed at once. ``fused``: None takes ``FUSED_BY_DEFAULT``; the fused
    path falls back to full logits for models it does not apply to (see ``fused_lm_head``). ``temperature`` (> 0):
    the distribution is softmax(logits / temperature)."""
    temperature = _checked_temperature(temperature)
    head = fused_lm_head(model) if (FUSED_BY_DEFAULT if fused is None else fused) else None
    if head is not None:
        return _fused_response_log_probs(model, head, input_ids, attention_mask, position_ids, responses,
                                         with_entropy, chunk_size, temperature)
    width = responses.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits
    return _scaled_log_probs(logits[:, -width - 1:-1], responses, temperature, with_entropy, chunk_size)


def packed_response_log_probs(model, packed: PackedRows, with_entropy: bool = False, chunk_size: int = 2048,
                              fused: Optional[bool] = None, temperature: float = 1.0
                              ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``response_log_probs`` of a packed micro-batch (``reasonrl.data.packing.pack_rows``): log-probs [rows, T] and
    optionally entropy [rows, T], float32, 0 at padding, at ``temperature``."""
    temperature = _checked_temperature(temperature)
    inputs = dict(input_ids=packed.input_ids, attention_mask=None, position_ids=packed.position_ids)
    labels = packed.labels[None]
    head = fused_lm_head(model) if (FUSED_BY_DEFAULT if fused is None else fused) else None
    if head is not None:
        log_probs, entropy = _fused_log_probs(model, head, labels, packed.predict_index, with_entropy, chunk_size,
                                              temperature, **inputs)
    else:
        logits = model(**inputs, use_cache=False).logits[:, packed.predict_index]
        log_probs, entropy = _scaled_log_probs(logits, labels, temperature, with_entropy, chunk_size)
    return packed.unpack(log_probs[0]), (packed.unpack(entropy[0]) if with_entropy else None)


def micro_batch_log_probs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                          responses: torch.Tensor, with_entropy: bool = False, packed: bool = False,
                          chunk_size: int = 2048, fused: Optional[bool] = None, temperature: float = 1.0
                          ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs (and entropy) [rows, T] of one rollout micro-batch at ``temperature``, 0 at padding: packed into
    one row (``packed``), or padded with the columns that hold no valid token in any row trimmed off."""
    width = responses.shape[1]
    if packed:
        rows = pack_rows(input_ids, attention_mask, position_ids, width)
        return packed_response_log_probs(model, rows, with_entropy, chunk_size, fused, temperature)
    first, kept = trimmed_columns(attention_mask, width)
    end = input_ids.shape[1] - width + kept
    log_probs, entropy = response_log_probs(model, input_ids[:, first:end], attention_mask[:, first:end],
                                            position_ids[:, first:end], responses[:, :kept], with_entropy,
                                            chunk_size, fused, temperature)
    valid = attention_mask[:, -width:].bool()

    def to_width(values: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, torch.nn.functional.pad(values, (0, width - kept)), 0.0)

    return to_width(log_probs), (to_width(entropy) if entropy is not None else None)
