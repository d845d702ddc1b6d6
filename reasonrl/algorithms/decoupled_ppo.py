"""The decoupled PPO objective (Hilton et al. 2021, "Batch size-invariance for policy optimization"; AReaL's
asynchronous RL): the policy that *sampled* the batch (the behaviour policy pi_behav, the rollout engine's log-probs,
possibly several weight versions old) is kept apart from the policy the trust region is taken around (the proximal
policy pi_prox, the trainer's own log-probs of the batch at the start of the update, ``old_log_probs``).

Per valid token t, with r_t = pi_theta(y_t) / pi_prox(y_t) and the behaviour weight w_t = pi_prox(y_t) / pi_behav(y_t)::

    loss_t = min(w_t, cap) * max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))     (dual clip as ppo_clip)

aggregated by ``agg_mode``. The clip keeps each update close to pi_prox, whatever the data's age, while w_t (no
gradient) corrects the expectation from pi_behav's samples to pi_prox's; ``cap`` (``inf``: none) bounds its variance.
Where pi_prox = pi_behav (on-policy, no engine gap) w_t = 1 and this is ``ppo_clip``. It is ``ppo_clip`` with
token-level truncated importance weights, written as one function of the three log-probs.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

from torch import Tensor

from .importance import tis_weights
from .policy_loss import policy_loss


def decoupled_ppo_loss(*, log_probs: Tensor, prox_log_probs: Tensor, behav_log_probs: Tensor, advantages: Tensor,
                       mask: Tensor, clip_low: float, clip_high: float, clip_dual: float = 3.0,
                       cap: float = math.inf, agg_mode: str = "token-mean",
                       norm_length: Optional[int] = None) -> Tuple[Tensor, Dict[str, float]]:
    """(scalar loss, metrics) of the decoupled PPO objective (see the module docstring); the metrics are
    ``ppo_clip``'s, with the ratio and ``actor/ppo_kl`` taken against pi_prox."""
    behav_weights = tis_weights(prox_log_probs, behav_log_probs, mask, "token", cap)
    return policy_loss("ppo_clip", log_probs=log_probs, old_log_probs=prox_log_probs, advantages=advantages,
                       mask=mask, clip_low=clip_low, clip_high=clip_high, clip_dual=clip_dual, agg_mode=agg_mode,
                       norm_length=norm_length, is_weights=behav_weights)
