"""The ``algorithm`` section of the config: the objective (advantage estimator, policy loss and its options, KL terms
and their controller, DAPO shaping, off-policy corrections). One docstring per field; ``docs/configuration.md``
is generated from these and ``schema.py`` together (``python -m reasonrl.config.docs``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict


@dataclass
class OffPolicyConfig:
    """Off-policy corrections between the policy that sampled the batch (the behaviour policy: the engine's per-token
    log-probs) and the trainer's proximal policy (its log-probs of the batch at the start of the update); see
    docs/algorithms.md. Any correction but none makes rollouts ask the engine for log-probs (``rollout.logprobs``)."""

    correction: str = "none"
    """none; tis (truncated IS: every token's loss times min(w, cap), w = pi_prox / pi_behav at ``level``); mis
    (masked IS: the loss times w where lower <= w <= upper; a token, or with level sequence a whole sequence, outside
    that interval leaves the actor's loss and its denominator; runs the old-log-prob pass); decoupled (the decoupled PPO
    objective: ``ppo_clip``'s clipped ratio pi_theta / pi_prox times the token weight min(w, cap); needs
    ``algorithm.policy_loss=ppo_clip`` and level token). PPO's clip stays on in every mode."""
    level: str = "token"
    """Where one weight applies (tis, mis): token (w_t per token), or sequence (w = the product of the sequence's token
    ratios, on all its tokens)."""
    cap: float = 2.0
    """tis and decoupled: the weight's truncation cap (``inf``: no truncation)."""
    lower: float = 0.5
    """mis: the smallest weight kept (0 <= lower <= 1)."""
    upper: float = 2.0
    """mis: the largest weight kept (>= 1)."""


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    """The preset this section came from: one of ``ALGORITHM_PRESETS`` (docs/algorithms.md; informational)."""
    adv_estimator: str = "grpo"
    """Advantage estimator, a name in ``reasonrl.algorithms.ADV_ESTIMATORS``: grpo, drgrpo, rloo, reinforce_pp,
    reinforce_pp_baseline, gae, remax, pass_at_k."""
    norm_by_std: bool = True
    """GRPO: divide by the group's reward std (false gives Dr.GRPO)."""
    pass_k: int = 4
    """pass_at_k advantage: the k of pass@k (1 <= k <= rollout.n); other estimators ignore it."""
    policy_loss: str = "ppo_clip"
    """Policy loss, a name in ``reasonrl.algorithms.POLICY_LOSSES``: ppo_clip, gspo, cispo, sapo, gmpo, clip_cov,
    kl_cov."""
    policy_loss_options: Dict[str, float] = field(default_factory=dict)
    """Extra hyper-parameters of the policy loss, e.g. ``algorithm.policy_loss_options.tau_neg=1.1`` (sapo: tau_pos,
    tau_neg; cispo: weight_min; clip_cov: clip_cov_ratio, clip_cov_lb, clip_cov_ub; kl_cov: kl_cov_ratio,
    kl_cov_coef); an option the loss does not take is an error. Unset options keep the loss's defaults."""
    clip_ratio_low: float = 0.2
    """PPO clip: lower bound 1 - clip_ratio_low (gmpo: the log-ratio's lower bound -clip_ratio_low)."""
    clip_ratio_high: float = 0.2
    """PPO clip: upper bound 1 + clip_ratio_high (DAPO clip-higher uses 0.28; cispo: the IS weight's cap;
    gmpo: the log-ratio's upper bound)."""
    clip_ratio_dual: float = 3.0
    """Dual clip: bound on the loss for negative advantages (0: off)."""
    loss_agg_mode: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm."""
    use_kl_loss: bool = True
    """Put KL(actor || reference) in the loss (GRPO); false with kl_in_reward for PPO-style reward penalty."""
    kl_coef: float = 0.001
    """Weight of the KL term (in the loss or the reward); the initial value with kl_ctrl=adaptive."""
    kl_loss_estimator: str = "k3"
    """KL estimator in the loss (use_kl_loss): k1, k2, k3 (docs/algorithms.md: which gradient each gives)."""
    kl_reward_estimator: str = "k1"
    """KL estimator in the reward (kl_in_reward): k1, k2, k3; k1 makes the reward's KL term unbiased."""
    kl_ctrl: str = "fixed"
    """KL coefficient controller: fixed, or adaptive (Ziegler et al. 2019: kl_coef moves to hold kl_target)."""
    kl_target: float = 0.1
    """kl_ctrl=adaptive: the KL per step to hold (the batch's mean per-token KL, as actor/kl)."""
    kl_horizon: float = 10000.0
    """kl_ctrl=adaptive: responses over which a persistent 20% KL error changes kl_coef by about e^0.2."""
    kl_in_reward: bool = False
    """Subtract kl_coef * KL from the token rewards instead of adding it to the loss."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0: off)."""
    gamma: float = 1.0
    """Discount for GAE and REINFORCE++ returns."""
    lam: float = 1.0
    """GAE lambda."""
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    """Off-policy corrections (the old ``algorithm.tis_mode=token|sequence`` and ``algorithm.tis_cap`` still work:
    they set ``off_policy.correction=tis`` with that level, and ``off_policy.cap``)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and refill the batch."""
    max_resample_rounds: int = 3
    """DAPO dynamic sampling: most extra rollout rounds per step."""
    overlong_buffer: int = 0
    """DAPO overlong shaping: tokens before max_new_tokens where a linear penalty starts (0: off)."""
    overlong_penalty: float = 1.0
    """DAPO overlong shaping: penalty reached at max_new_tokens."""


def reported_version_lags(cfg) -> range:
    """The version lags the ``offpolicy/*/lag_<k>`` metrics report: 0 .. ``async_rollout.max_staleness`` with
    ``trainer.mode=async``, else 0 (the same keys on every rank)."""
    return range(cfg.async_rollout.max_staleness + 1 if cfg.trainer.mode == "async" else 1)
