"""Pure tensor functions of RL for LLMs: advantage estimators, policy/value losses, KL, loss aggregation,
DAPO data shaping and truncated importance sampling. Imports only torch; registries by name.

Shapes: B responses, T response tokens (right-padded); ``mask`` is a 0/1 [B, T] response mask and
``group_index`` a LongTensor [B] (responses to the same prompt share an id).
"""

from .advantages import (
    ADV_ESTIMATORS,
    compute_advantages,
    discounted_returns,
    group_mean_std,
    kl_shaped_token_rewards,
    register_adv_estimator,
    scores_to_token_rewards,
)
from .aggregation import LOSS_AGG_MODES, aggregate_loss, masked_mean, masked_sum, masked_var, masked_whiten
from .dapo import filter_groups, overlong_penalty
from .importance import TIS_MODES, logprob_mismatch_stats, tis_weights
from .kl import KL_ESTIMATORS, kl_penalty
from .logprob import entropy_from_logits, log_probs_from_logits
from .policy_loss import POLICY_LOSSES, clipped_surrogate, policy_loss, register_policy_loss
from .value_loss import explained_variance, value_loss

__all__ = [
    "ADV_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "TIS_MODES",
    "aggregate_loss",
    "clipped_surrogate",
    "compute_advantages",
    "discounted_returns",
    "entropy_from_logits",
    "explained_variance",
    "filter_groups",
    "group_mean_std",
    "kl_penalty",
    "kl_shaped_token_rewards",
    "log_probs_from_logits",
    "logprob_mismatch_stats",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "policy_loss",
    "register_adv_estimator",
    "register_policy_loss",
    "scores_to_token_rewards",
    "tis_weights",
    "value_loss",
]
