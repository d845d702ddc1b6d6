"""Advantage estimators, selected by name: ``compute_advantages("grpo", scores=..., mask=..., ...)``.

Shapes: B responses, T response tokens (right-padded). ``scores`` [B] is the verifier's reward per
response, ``mask`` [B, T] marks real response tokens, ``group_index`` [B] gives responses of the same
prompt the same id. Every estimator returns ``(advantages, returns)``, both [B, T] and 0 outside the mask.

KL in the reward (``kl_in_reward``): ``token_rewards`` [B, T] (``kl_shaped_token_rewards``: the score on the
last valid token, ``-kl_coef * kl_t`` on every valid token) replace the scores. The token-level estimators
(reinforce_pp, gae) discount them; the sequence-level ones (grpo, drgrpo, rloo, remax) use the response's
reward R_i = sum of its token rewards over its valid tokens = s_i - kl_coef * sum_t kl_t. ``pass_at_k`` needs
0/1 scores and refuses them.

Add an estimator with::

    @register_adv_estimator("mine")
    def mine(*, scores, mask, group_index, **unused): ...
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from reasonrl.registry import Registry

from .aggregation import check_same_shape, masked_fill_zero, masked_whiten

AdvEstimator = Callable[..., Tuple[Tensor, Tensor]]
ADV_ESTIMATORS = Registry("advantage estimator", config_key="algorithm.adv_estimator")


def register_adv_estimator(name: str) -> Callable[[AdvEstimator], AdvEstimator]:
    """Decorator that adds an estimator to ``ADV_ESTIMATORS`` under ``name``."""

    return ADV_ESTIMATORS.register(name)


def compute_advantages(
    name: str,
    *,
    scores: Tensor,
    mask: Tensor,
    group_index: Tensor,
    token_rewards: Optional[Tensor] = None,
    values: Optional[Tensor] = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    baseline_scores: Optional[Tensor] = None,
    pass_k: int = 1,
) -> Tuple[Tensor, Tensor]:
    """Run the estimator registered as ``name``; returns (advantages [B, T], returns [B, T]).

    ``baseline_scores`` [B] (ReMax): the reward of the greedy response to each response's prompt.
    ``pass_k`` (pass_at_k): the k of pass@k, 1 <= k <= group size.
    """
    estimator = ADV_ESTIMATORS[name]
    if scores.dim() != 1 or mask.dim() != 2 or mask.shape[0] != scores.shape[0]:
        raise ValueError(f"expected scores [B] and mask [B, T], got {tuple(scores.shape)} and {tuple(mask.shape)}")
    if group_index.shape != scores.shape:
        raise ValueError(f"group_index must be [B]={tuple(scores.shape)}, got {tuple(group_index.shape)}")
    check_same_shape(mask=mask, token_rewards=token_rewards, values=values)
    if baseline_scores is not None and baseline_scores.shape != scores.shape:
        raise ValueError(f"baseline_scores must be [B]={tuple(scores.shape)}, got {tuple(baseline_scores.shape)}")
    return estimator(
        scores=scores.float(),
        mask=mask,
        group_index=group_index,
        token_rewards=None if token_rewards is None else token_rewards.float(),
        values=None if values is None else values.float(),
        gamma=gamma,
        lam=lam,
        norm_by_std=norm_by_std,
        eps=eps,
        baseline_scores=None if baseline_scores is None else baseline_scores.float(),
        pass_k=pass_k,
    )


# ----------------------------------------------------------------------------- helpers


def group_mean_std(scores: Tensor, group_index: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Per-response (group mean, group std, group size), each [B].

    The std is Bessel-corrected (divides by n - 1) as in GRPO; a group of one has std 0.
    Group ids may be any integers; they need not be contiguous or sorted.
    """
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    counts_f = counts.to(scores.dtype)
    sums = torch.zeros_like(counts_f).index_add_(0, inverse, scores)
    means = sums / counts_f
    sq_dev = torch.zeros_like(counts_f).index_add_(0, inverse, (scores - means[inverse]) ** 2)
    stds = (sq_dev / (counts_f - 1).clamp(min=1)).sqrt()
    return means[inverse], stds[inverse], counts[inverse]


def scores_to_token_rewards(scores: Tensor, mask: Tensor) -> Tensor:
    """Place each response's scalar score on its last valid token: [B] -> [B, T].

    A response without any valid token gets no reward.
    """
    mask_b = mask.bool()
    lengths = mask_b.sum(dim=-1)
    last = mask_b.shape[-1] - 1 - mask_b.flip(-1).int().argmax(dim=-1)  # index of the last valid token
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] = torch.where(lengths > 0, scores, torch.zeros_like(scores))
    return rewards


def kl_shaped_token_rewards(scores: Tensor, kl: Tensor, mask: Tensor, kl_coef: float) -> Tensor:
    """Per-token rewards with the KL penalty in the reward (PPO / RLOO / REINFORCE++ ``kl_in_reward``):
    ``-kl_coef * kl_t`` on every valid token, plus the response's score on its last valid token.

    ``kl`` [B, T] is a per-token KL estimate (``kl_penalty``); a response without any valid token gets 0 everywhere.
    """
    return scores_to_token_rewards(scores, mask) - kl_coef * masked_fill_zero(kl, mask)


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t'} where t' is the next valid token; masked tokens are skipped, 0 there."""
    mask_b = mask.bool()
    running = torch.zeros_like(token_rewards[:, 0])
    returns = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[-1])):
        running = torch.where(mask_b[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return masked_fill_zero(returns, mask)


def _broadcast(per_response: Tensor, mask: Tensor) -> Tensor:
    """[B] -> [B, T], the same value on every valid token, 0 elsewhere."""
    return masked_fill_zero(per_response[:, None].expand(mask.shape).clone(), mask)


def _token_rewards_or_scores(token_rewards: Optional[Tensor], scores: Tensor, mask: Tensor) -> Tensor:
    return scores_to_token_rewards(scores, mask) if token_rewards is None else masked_fill_zero(token_rewards, mask)


def sequence_rewards(scores: Tensor, token_rewards: Optional[Tensor], mask: Tensor) -> Tensor:
    """Each response's reward [B]: its score, or with ``token_rewards`` their sum over its valid tokens
    (score minus kl_coef * its summed KL for ``kl_shaped_token_rewards``)."""
    return scores if token_rewards is None else masked_fill_zero(token_rewards, mask).sum(dim=-1)


# ----------------------------------------------------------------------------- estimators


@register_adv_estimator("grpo")
def grpo_advantages(
    *,
    scores: Tensor,
    mask: Tensor,
    group_index: Tensor,
    token_rewards: Optional[Tensor] = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    **unused,
) -> Tuple[Tensor, Tensor]:
    """GRPO: A_i = (R_i - mean_group) / (std_group + eps) on every token; ``norm_by_std=False`` drops the std.

    R_i is the score, or the sum of the response's ``token_rewards`` when given (``sequence_rewards``).
    A group of one, or a group whose rewards are all equal, gets advantage 0. Returns equal advantages.
    """
    rewards = sequence_rewards(scores, token_rewards, mask)
    mean, std, _ = group_mean_std(rewards, group_index)
    adv = rewards - mean
    if norm_by_std:
        adv = adv / (std + eps)
    adv_tokens = _broadcast(adv, mask)
    return adv_tokens, adv_tokens.clone()


@register_adv_estimator("drgrpo")
def drgrpo_advantages(
    *, scores: Tensor, mask: Tensor, group_index: Tensor, token_rewards: Optional[Tensor] = None, **unused
) -> Tuple[Tensor, Tensor]:
    """Dr.GRPO: A_i = R_i - mean_group (GRPO without the std division, whatever ``norm_by_std`` says)."""
    return grpo_advantages(
        scores=scores, mask=mask, group_index=group_index, token_rewards=token_rewards, norm_by_std=False
    )


@register_adv_estimator("rloo")
def rloo_advantages(
    *, scores: Tensor, mask: Tensor, group_index: Tensor, token_rewards: Optional[Tensor] = None, **unused
) -> Tuple[Tensor, Tensor]:
    """RLOO: A_i = R_i - mean of the other n-1 rewards of its group = n/(n-1) * (R_i - mean_group).

    R_i is the score, or with ``token_rewards`` their sum: s_i - kl_coef * sum_t kl_t, RLOO's KL-penalised
    reward inside the leave-one-out. A group of one has no other sample to compare with: advantage 0.
    """
    rewards = sequence_rewards(scores, token_rewards, mask)
    mean, _, counts = group_mean_std(rewards, group_index)
    n = counts.to(rewards.dtype)
    adv = torch.where(counts > 1, (rewards - mean) * n / (n - 1).clamp(min=1), torch.zeros_like(rewards))
    adv_tokens = _broadcast(adv, mask)
    return adv_tokens, adv_tokens.clone()


@register_adv_estimator("reinforce_pp")
def reinforce_pp_advantages(
    *,
    scores: Tensor,
    mask: Tensor,
    token_rewards: Optional[Tensor] = None,
    gamma: float = 1.0,
    eps: float = 1e-6,
    **unused,
) -> Tuple[Tensor, Tensor]:
    """REINFORCE++: discounted returns of the token rewards, whitened over the batch's valid tokens.

    Without ``token_rewards`` the score sits on each response's last valid token. Returns are the
    un-whitened discounted returns.
    """
    rewards = _token_rewards_or_scores(token_rewards, scores, mask)
    returns = discounted_returns(rewards, mask, gamma)
    return masked_whiten(returns, mask, eps), returns


@register_adv_estimator("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(
    *,
    scores: Tensor,
    mask: Tensor,
    group_index: Tensor,
    token_rewards: Optional[Tensor] = None,
    gamma: float = 1.0,
    eps: float = 1e-6,
    **unused,
) -> Tuple[Tensor, Tensor]:
    """REINFORCE++ with a group baseline: the group's mean score is subtracted on the last valid token,
    then returns are discounted and whitened over the batch's valid tokens as in ``reinforce_pp``.
    """
    mean, _, _ = group_mean_std(scores, group_index)
    rewards = _token_rewards_or_scores(token_rewards, scores, mask) - scores_to_token_rewards(mean, mask)
    returns = discounted_returns(rewards, mask, gamma)
    return masked_whiten(returns, mask, eps), returns


@register_adv_estimator("gae")
def gae_advantages(
    *,
    scores: Tensor,
    mask: Tensor,
    values: Optional[Tensor] = None,
    token_rewards: Optional[Tensor] = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    eps: float = 1e-6,
    **unused,
) -> Tuple[Tensor, Tensor]:
    """Generalised advantage estimation (PPO with a critic).

    delta_t = r_t + gamma * V_{t'} - V_t, A_t = delta_t + gamma * lam * A_{t'} where t' is the next
    valid token (V and A are 0 after the last one). Returns = A + V (un-whitened); the advantages
    handed back are whitened over the batch's valid tokens.
    """
    if values is None:
        raise ValueError("the 'gae' advantage estimator needs values (a critic)")
    rewards = _token_rewards_or_scores(token_rewards, scores, mask)
    values = masked_fill_zero(values, mask)
    mask_b = mask.bool()
    next_value = torch.zeros_like(values[:, 0])
    running = torch.zeros_like(values[:, 0])
    raw_adv = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(mask_b[:, t], delta + gamma * lam * running, running)
        next_value = torch.where(mask_b[:, t], values[:, t], next_value)
        raw_adv[:, t] = running
    raw_adv = masked_fill_zero(raw_adv, mask)
    returns = masked_fill_zero(raw_adv + values, mask)
    return masked_whiten(raw_adv, mask, eps), returns


@register_adv_estimator("remax")
def remax_advantages(
    *,
    scores: Tensor,
    mask: Tensor,
    token_rewards: Optional[Tensor] = None,
    baseline_scores: Optional[Tensor] = None,
    **unused,
) -> Tuple[Tensor, Tensor]:
    """ReMax (Li et al., 2023): A_i = R_i - b_i on every token, b_i the reward of the greedy response to
    response i's prompt (``baseline_scores`` [B]); R_i as in ``sequence_rewards``. Returns equal advantages."""
    if baseline_scores is None:
        raise ValueError("the 'remax' advantage estimator needs baseline_scores [B]: the greedy response's reward "
                         "for each response's prompt")
    adv_tokens = _broadcast(sequence_rewards(scores, token_rewards, mask) - baseline_scores, mask)
    return adv_tokens, adv_tokens.clone()


def _comb(n: Tensor, k: int) -> Tensor:
    """C(n, k) elementwise for a float tensor n >= 0 (0 where n < k), exact for the small n of a group."""
    out = torch.ones_like(n)
    for j in range(k):
        out = out * (n - j).clamp(min=0) / (j + 1)
    return out


@register_adv_estimator("pass_at_k")
def pass_at_k_advantages(
    *,
    scores: Tensor,
    mask: Tensor,
    group_index: Tensor,
    token_rewards: Optional[Tensor] = None,
    pass_k: int = 1,
    eps: float = 1e-6,
    **unused,
) -> Tuple[Tensor, Tensor]:
    """Pass@k advantage (Chen et al., 2025, "Pass@k Training", analytical form) for 0/1 scores.

    A group of N responses with N_pos correct (N_neg = N - N_pos) is scored as the mean over all its
    size-k subsets of max(scores in the subset), each subset's reward normalised by the subsets' mean
    R = 1 - C(N_neg, k) / C(N, k) and std sigma = sqrt(R (1 - R)); a response's advantage is the mean over the
    subsets containing it:
      correct:   A = (1 - R) / sigma
      incorrect: A = (1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / sigma
    k = 1 is GRPO with the population std. An all-correct or all-wrong group gets 0; a group smaller than k
    (no size-k subset) is refused.
    """
    if token_rewards is not None:
        raise ValueError("the 'pass_at_k' advantage estimator counts 0/1 scores and cannot use KL-shaped token "
                         "rewards; put the KL in the loss (algorithm.use_kl_loss) instead of algorithm.kl_in_reward")
    if not bool(((scores == 0) | (scores == 1)).all()):
        raise ValueError("the 'pass_at_k' advantage estimator needs scores of exactly 0 or 1 (correct or not); got "
                         f"{sorted(set(scores.tolist()))[:5]} (reward shaping such as algorithm.overlong_buffer "
                         "makes them fractional)")
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    if pass_k < 1 or int(counts.min()) < pass_k:
        raise ValueError(f"pass_at_k needs 1 <= k <= group size; got k={pass_k}, smallest group {int(counts.min())}")
    n = counts.to(scores.dtype)
    n_pos = torch.zeros_like(n).index_add_(0, inverse, scores)
    n_neg = n - n_pos
    group_reward = 1 - _comb(n_neg, pass_k) / _comb(n, pass_k)
    sigma = (group_reward * (1 - group_reward)).clamp(min=0).sqrt()
    miss_share = _comb(n_neg - 1, pass_k - 1) / _comb(n - 1, pass_k - 1)  # subsets with i that are all wrong
    adv_pos = (1 - group_reward) / (sigma + eps)
    adv_neg = (1 - group_reward - miss_share) / (sigma + eps)
    adv = torch.where(scores == 1, adv_pos[inverse], adv_neg[inverse])
    adv = torch.where(sigma[inverse] > 0, adv, torch.zeros_like(adv))
    adv_tokens = _broadcast(adv, mask)
    return adv_tokens, adv_tokens.clone()
