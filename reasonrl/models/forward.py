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
"""
from __future__ import annotations

import contextlib
import inspect
import os
from typing import Callable, Iterator, Optional, Tuple

import torch
from torch import nn

from reasonrl.algorithms.logprob import entropy_from_logits, log_probs_from_logits
from reasonrl.models.fused_logprob import linear_log_probs

FUSED_BY_DEFAULT = os.environ.get("REASONRL_FUSED_LOGPROBS", "1").lower() not in ("0", "false", "no")
"""Whether ``response_log_probs`` takes the fused path when its ``fused`` argument is None."""

# Config fields of Hugging Face models that transform the LM head's output (soft-capping, scaling): such models keep
# the full-logits path, since the fused path assumes log-probs of exactly ``hidden @ lm_head.weight^T``.
LOGIT_TRANSFORM_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


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
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
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


def _fused_response_log_probs(model, head: nn.Linear, input_ids, attention_mask, position_ids, responses,
                              with_entropy: bool, chunk_size: int):
    width = responses.shape[1]

    def head_to_log_probs(hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [b, width + 1, H], the last width + 1 positions; the first width of them predict the response.
        log_probs, entropy = linear_log_probs(hidden[:, :width], head.weight, responses, chunk_size, with_entropy)
        # A new tensor, not a view: FSDP2 hooks the root's output for backward (and warns about views).
        return torch.stack([log_probs, entropy] if with_entropy else [log_probs], dim=-1)

    with _head_forward_replaced(head, head_to_log_probs):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                    logits_to_keep=width + 1).logits
    return out[..., 0], (out[..., 1] if with_entropy else None)


def response_log_probs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                       responses: torch.Tensor, with_entropy: bool = False, chunk_size: int = 2048,
                       fused: Optional[bool] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs [b, T] of ``responses`` (the last T columns of ``input_ids``) and, optionally, the entropy [b, T]
    of the model's next-token distribution at each response position, float32.

    ``chunk_size``: tokens whose logits are computed at once. ``fused``: None takes ``FUSED_BY_DEFAULT``; the fused
    path falls back to full logits for models it does not apply to (see ``fused_lm_head``)."""
    head = fused_lm_head(model) if (FUSED_BY_DEFAULT if fused is None else fused) else None
    if head is not None:
        return _fused_response_log_probs(model, head, input_ids, attention_mask, position_ids, responses,
                                         with_entropy, chunk_size)
    width = responses.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits
    logits = logits[:, -width - 1:-1]
    log_probs = log_probs_from_logits(logits, responses, chunk_size=chunk_size)
    entropy = entropy_from_logits(logits, chunk_size=chunk_size) if with_entropy else None
    return log_probs, entropy
