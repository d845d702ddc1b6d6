"""Pure tensor functions of RL for LLMs: advantage estimators, policy/value losses, KL and its controllers, loss
aggregation, DAPO data shaping and off-policy corrections (truncated and masked importance sampling, decoupled PPO)
with their statistics. Imports only torch; registries by name (ADV_ESTIMATORS, POLICY_LOSSES with POLICY_LOSS_OPTIONS,
LOSS_AGG_MODES, KL_ESTIMATORS, KL_CONTROLLERS).

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
    sequence_rewards,
)
from .aggregation import (
    LOSS_AGG_MODES,
    agg_denominator,
    aggregate_loss,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from .dapo import filter_groups, overlong_penalty
from .decoupled_ppo import decoupled_ppo_loss
from .importance import (CORRECTIONS, IS_LEVELS, correction_weights, log_is_ratio, logprob_mismatch_stats, mis_weights,
                         tis_weights)
from .kl import KL_ESTIMATORS, kl_penalty
from .kl_control import KL_CONTROLLERS, AdaptiveKLController, FixedKLController, make_kl_controller
from .logprob import entropy_from_logits, log_probs_from_logits
from .off_policy_metrics import combine_sums, off_policy_metrics, off_policy_sums
from .policy_loss import (
    POLICY_LOSS_OPTIONS,
    POLICY_LOSSES,
    clipped_surrogate,
    policy_loss,
    register_policy_loss,
    resolve_policy_loss_options,
)
from . import covariance_losses, policy_loss_variants  # noqa: F401,E402  (register cispo, sapo, gmpo, clip_cov, kl_cov)
from .value_loss import explained_variance, value_loss

__all__ = [
    "ADV_ESTIMATORS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "POLICY_LOSS_OPTIONS",
    "CORRECTIONS",
    "IS_LEVELS",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_denominator",
    "aggregate_loss",
    "clipped_surrogate",
    "combine_sums",
    "compute_advantages",
    "correction_weights",
    "decoupled_ppo_loss",
    "discounted_returns",
    "entropy_from_logits",
    "explained_variance",
    "filter_groups",
    "group_mean_std",
    "kl_penalty",
    "kl_shaped_token_rewards",
    "log_is_ratio",
    "log_probs_from_logits",
    "logprob_mismatch_stats",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "mis_weights",
    "off_policy_metrics",
    "off_policy_sums",
    "overlong_penalty",
    "policy_loss",
    "register_adv_estimator",
    "register_policy_loss",
    "resolve_policy_loss_options",
    "scores_to_token_rewards",
    "sequence_rewards",
    "tis_weights",
    "value_loss",
]
