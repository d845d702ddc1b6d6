"""Advantage estimators: every expected value is derived by hand in the comment next to it."""

import math

import pytest
import torch

from reasonrl.algorithms import (
    ADV_ESTIMATORS,
    compute_advantages,
    discounted_returns,
    group_mean_std,
    kl_shaped_token_rewards,
    register_adv_estimator,
    scores_to_token_rewards,
)

ATOL = 1e-5


def close(actual, expected, atol=ATOL):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# Three responses of one prompt with lengths 3, 2, 1 (T = 3, right-padded).
MASK_321 = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float32)


def test_grpo_group_mean_and_unbiased_std():
    # scores [1, 0, 0]: mean 1/3; unbiased var = ((2/3)^2 + 2 * (1/3)^2) / (3 - 1) = (6/9) / 2 = 1/3,
    # std = 0.577350. A = (2/3) / 0.577350 = 1.154701 and -(1/3) / 0.577350 = -0.577350.
    adv, ret = compute_advantages(
        "grpo", scores=torch.tensor([1.0, 0.0, 0.0]), mask=MASK_321, group_index=torch.tensor([0, 0, 0])
    )
    a, b = 1.154701, -0.577350
    close(adv, [[a, a, a], [b, b, 0.0], [b, 0.0, 0.0]])  # broadcast to valid tokens, 0 on padding
    close(ret, adv)  # GRPO has no critic: returns are the advantages


def test_grpo_without_std_is_drgrpo():
    # Dr.GRPO: A = s - mean = [2/3, -1/3, -1/3], no division.
    kwargs = dict(scores=torch.tensor([1.0, 0.0, 0.0]), mask=MASK_321, group_index=torch.tensor([0, 0, 0]))
    adv_dr, _ = compute_advantages("drgrpo", **kwargs)
    adv_nostd, _ = compute_advantages("grpo", norm_by_std=False, **kwargs)
    a, b = 2 / 3, -1 / 3
    close(adv_dr, [[a, a, a], [b, b, 0.0], [b, 0.0, 0.0]])
    close(adv_nostd, adv_dr)
    # drgrpo never divides, even when asked to.
    close(compute_advantages("drgrpo", norm_by_std=True, **kwargs)[0], adv_dr)


def test_grpo_groups_may_be_interleaved_with_any_ids():
    # group 7 = responses 0, 2 with scores [1, 0]: mean 0.5, unbiased std = sqrt(2 * 0.25 / 1) = 0.707107,
    #   A = +-0.5 / 0.707107 = +-0.707107.
    # group 3 = responses 1, 3 with scores [0, 2]: mean 1, std = sqrt(2 * 1 / 1) = 1.414214, A = -+0.707107.
    mask = torch.ones(4, 2)
    adv, _ = compute_advantages(
        "grpo", scores=torch.tensor([1.0, 0.0, 0.0, 2.0]), mask=mask, group_index=torch.tensor([7, 3, 7, 3])
    )
    c = 0.707107
    close(adv[:, 0], [c, -c, -c, c])


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_group_of_size_one_gets_zero_advantage(name):
    # A lone response is its own group mean (grpo/drgrpo) and has no other sample to compare with (rloo).
    adv, ret = compute_advantages(
        name, scores=torch.tensor([1.0, 0.3]), mask=torch.ones(2, 3), group_index=torch.tensor([0, 1])
    )
    close(adv, torch.zeros(2, 3))
    close(ret, torch.zeros(2, 3))


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_all_equal_rewards_give_zero_not_nan(name):
    # s - mean = 0 and std = 0: 0 / (0 + eps) = 0, not NaN.
    adv, _ = compute_advantages(
        name, scores=torch.tensor([1.0, 1.0, 1.0, 1.0]), mask=torch.ones(4, 2), group_index=torch.zeros(4).long()
    )
    close(adv, torch.zeros(4, 2))


def test_rloo_leave_one_out_baseline():
    # scores [1, 0, 0, 1] in one group. For s=1 the others are [0, 0, 1]: baseline 1/3, A = 2/3.
    # For s=0 the others are [0, 1, 1]: baseline 2/3, A = -2/3.  (= n/(n-1) * (s - mean) = 4/3 * +-0.5.)
    adv, ret = compute_advantages(
        "rloo", scores=torch.tensor([1.0, 0.0, 0.0, 1.0]), mask=torch.ones(4, 1), group_index=torch.zeros(4).long()
    )
    close(adv[:, 0], [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    close(ret, adv)


# Two responses of lengths 3 and 2 for the REINFORCE++ and GAE examples.
MASK_32 = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float32)


def test_reinforce_pp_whitens_returns_over_valid_tokens():
    # scores [1, 0] on the last valid token, gamma 1: returns [[1, 1, 1], [0, 0, pad]].
    # Valid tokens {1, 1, 1, 0, 0}: mean 0.6; unbiased var = (3 * 0.4^2 + 2 * 0.6^2) / 4 = 0.3,
    # std = 0.547723. A = 0.4 / 0.547723 = 0.730297 and -0.6 / 0.547723 = -1.095445.
    adv, ret = compute_advantages(
        "reinforce_pp", scores=torch.tensor([1.0, 0.0]), mask=MASK_32, group_index=torch.tensor([0, 1])
    )
    close(ret, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    a, b = 0.730297, -1.095445
    close(adv, [[a, a, a], [b, b, 0.0]])


def test_reinforce_pp_discounts_and_uses_token_rewards():
    # gamma 0.5, score 1 on token 2: returns [0.25, 0.5, 1].
    _, ret = compute_advantages(
        "reinforce_pp", scores=torch.tensor([1.0]), mask=torch.ones(1, 3), group_index=torch.tensor([0]), gamma=0.5
    )
    close(ret, [[0.25, 0.5, 1.0]])
    # token_rewards replace the scores; the padding reward (9) is ignored. gamma 1:
    # row 0 rewards [0.1, 0, 1] -> returns [1.1, 1, 1]; row 1 rewards [0, -0.5] -> [-0.5, -0.5, 0].
    rewards = torch.tensor([[0.1, 0.0, 1.0], [0.0, -0.5, 9.0]])
    _, ret = compute_advantages(
        "reinforce_pp",
        scores=torch.tensor([123.0, 456.0]),
        mask=MASK_32,
        group_index=torch.tensor([0, 1]),
        token_rewards=rewards,
    )
    close(ret, [[1.1, 1.0, 1.0], [-0.5, -0.5, 0.0]])


def test_discounted_returns_skip_masked_tokens():
    # mask [1, 0, 1], rewards [0, 5, 1], gamma 0.5: the masked middle token neither earns its reward nor
    # counts as a step: G_2 = 1, G_0 = 0 + 0.5 * G_2 = 0.5, and 0 at the masked token.
    ret = discounted_returns(torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.5)
    close(ret, [[0.5, 0.0, 1.0]])


def test_reinforce_pp_baseline_subtracts_group_mean_first():
    # One group with scores [1, 0]: mean 0.5, so last-token rewards 0.5 and -0.5; gamma 1 returns
    # [[0.5, 0.5, 0.5], [-0.5, -0.5, pad]]. Valid tokens: mean (1.5 - 1) / 5 = 0.1; deviations 0.4 (x3), -0.6 (x2)
    # -> the same whitening as above: A = 0.730297 and -1.095445.
    adv, ret = compute_advantages(
        "reinforce_pp_baseline", scores=torch.tensor([1.0, 0.0]), mask=MASK_32, group_index=torch.tensor([0, 0])
    )
    close(ret, [[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]])
    a, b = 0.730297, -1.095445
    close(adv, [[a, a, a], [b, b, 0.0]])


def test_gae_by_hand():
    # gamma 0.9, lam 0.8 (gamma * lam = 0.72).
    # Row 0: values [0.2, 0.4, 0.6], score 1 on token 2.
    #   t2: delta = 1 + 0.9 * 0 - 0.6 = 0.4                 A2 = 0.4
    #   t1: delta = 0 + 0.9 * 0.6 - 0.4 = 0.14              A1 = 0.14 + 0.72 * 0.4 = 0.428
    #   t0: delta = 0 + 0.9 * 0.4 - 0.2 = 0.16              A0 = 0.16 + 0.72 * 0.428 = 0.46816
    #   returns = A + V = [0.66816, 0.828, 1.0]
    # Row 1: values [0.3, 0.1, pad 99], score 0, length 2 (V after the last token is 0, not the pad 99).
    #   t1: delta = 0 + 0 - 0.1 = -0.1                       A1 = -0.1
    #   t0: delta = 0 + 0.9 * 0.1 - 0.3 = -0.21              A0 = -0.21 + 0.72 * -0.1 = -0.282
    #   returns = [0.018, 0.0, 0 (pad)]
    values = torch.tensor([[0.2, 0.4, 0.6], [0.3, 0.1, 99.0]])
    adv, ret = compute_advantages(
        "gae",
        scores=torch.tensor([1.0, 0.0]),
        mask=MASK_32,
        group_index=torch.tensor([0, 1]),
        values=values,
        gamma=0.9,
        lam=0.8,
    )
    close(ret, [[0.66816, 0.828, 1.0], [0.018, 0.0, 0.0]])
    # Advantages are the raw ones above, whitened over the 5 valid tokens (unbiased std, eps 1e-6).
    raw = torch.tensor([0.46816, 0.428, 0.4, -0.282, -0.1])
    whitened = (raw - raw.mean()) / (raw.std() + 1e-6)
    close(adv[MASK_32.bool()], whitened)
    assert adv[1, 2] == 0.0


def test_gae_lambda_one_gamma_one_is_monte_carlo():
    # gamma = lam = 1: A_t = (sum of future rewards) - V_t, so returns = A + V = 1 on every token.
    _, ret = compute_advantages(
        "gae",
        scores=torch.tensor([1.0]),
        mask=torch.ones(1, 3),
        group_index=torch.tensor([0]),
        values=torch.tensor([[0.3, -2.0, 0.9]]),
    )
    close(ret, [[1.0, 1.0, 1.0]])


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", scores=torch.ones(1), mask=torch.ones(1, 2), group_index=torch.zeros(1).long())


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS))
def test_every_estimator_is_zero_and_finite_outside_the_mask(name):
    # Garbage (NaN) in padded positions of token_rewards/values must not leak anywhere.
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    garbage = torch.where(mask, torch.rand(4, 4), torch.full((4, 4), float("nan")))
    binary = name == "pass_at_k"  # counts 0/1 scores and refuses token rewards
    adv, ret = compute_advantages(
        name,
        scores=torch.tensor([1.0, 0.0, 1.0, 0.0 if binary else 0.5]),
        mask=mask,
        group_index=torch.tensor([0, 0, 1, 1]),
        values=garbage if name == "gae" else None,
        token_rewards=None if binary else garbage,
        baseline_scores=torch.tensor([0.5, 0.5, 0.2, 0.2]) if name == "remax" else None,
        pass_k=2,
    )
    for out in (adv, ret):
        assert out.shape == (4, 4)
        assert torch.isfinite(out).all()
        assert (out[~mask] == 0).all()


def test_scores_to_token_rewards_puts_score_on_last_valid_token():
    # lengths 3, 1, 0: score on index 2, on index 0, nowhere.
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    rewards = scores_to_token_rewards(torch.tensor([2.0, -1.0, 5.0]), mask)
    close(rewards, [[0, 0, 2.0, 0], [-1.0, 0, 0, 0], [0, 0, 0, 0]])


def test_kl_shaped_token_rewards_with_an_empty_response():
    # kl_coef 0.5; lengths 2, 1, 0 (the last response is empty: its row of the mask is all 0).
    # row 0: -0.5 * [0.2, 0.4] = [-0.1, -0.2], plus score 1.0 on index 1 -> [-0.1, 0.8, 0]
    # row 1: -0.5 * 0.6 = -0.3, plus score -1.0 on index 0 -> [-1.3, 0, 0]
    # row 2: no valid token: no score and no penalty anywhere (the KL of 9.0 at padding is ignored) -> [0, 0, 0]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.float32)
    kl = torch.tensor([[0.2, 0.4, 7.0], [0.6, 7.0, 7.0], [9.0, 9.0, 9.0]])
    rewards = kl_shaped_token_rewards(torch.tensor([1.0, -1.0, 3.0]), kl, mask, kl_coef=0.5)
    close(rewards, [[-0.1, 0.8, 0.0], [-1.3, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_group_mean_std_sizes():
    # groups {5: [1, 3]}, {2: [4]}: mean 2 (std sqrt(2) = 1.414214), mean 4 (std 0 for a group of one).
    mean, std, size = group_mean_std(torch.tensor([1.0, 4.0, 3.0]), torch.tensor([5, 2, 5]))
    close(mean, [2.0, 4.0, 2.0])
    close(std, [math.sqrt(2), 0.0, math.sqrt(2)])
    assert size.tolist() == [2, 1, 2]


def test_registry_and_bad_input():
    @register_adv_estimator("test_constant_one")
    def constant_one(*, mask, **unused):
        ones = mask.float()
        return ones, ones

    try:
        adv, _ = compute_advantages(
            "test_constant_one", scores=torch.zeros(2), mask=MASK_32, group_index=torch.zeros(2).long()
        )
        close(adv, MASK_32)
        with pytest.raises(ValueError, match="already registered"):
            register_adv_estimator("test_constant_one")(constant_one)
    finally:
        ADV_ESTIMATORS.unregister("test_constant_one")
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        compute_advantages("nope", scores=torch.zeros(2), mask=MASK_32, group_index=torch.zeros(2).long())
    with pytest.raises(ValueError, match="group_index"):
        compute_advantages("grpo", scores=torch.zeros(2), mask=MASK_32, group_index=torch.zeros(3).long())
    with pytest.raises(ValueError, match="values"):
        compute_advantages(
            "gae", scores=torch.zeros(2), mask=MASK_32, group_index=torch.zeros(2).long(), values=torch.zeros(2, 4)
        )
