"""Teacher-forced forward passes over (prompt + response) rows: per-token log-probs and entropy."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from reasonrl.algorithms.logprob import entropy_from_logits, log_probs_from_logits


def response_log_probs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                       responses: torch.Tensor, with_entropy: bool = False, chunk_size: int = 2048
                       ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs [b, T] of ``responses`` (the last T columns of ``input_ids``) and, optionally, the entropy [b, T]
    of the model's next-token distribution at each response position."""
    width = responses.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits
    logits = logits[:, -width - 1:-1]
    log_probs = log_probs_from_logits(logits, responses, chunk_size=chunk_size)
    entropy = entropy_from_logits(logits, chunk_size=chunk_size) if with_entropy else None
    return log_probs, entropy
