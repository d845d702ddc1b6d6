"""KL-shaped rewards in every sequence-level estimator, ReMax and the pass@k advantage; numbers derived by hand."""

import itertools
import math

import pytest
import torch

from reasonrl.algorithms import compute_advantages, kl_shaped_token_rewards, sequence_rewards

ATOL = 1e-5


def close(actual, expected, atol=ATOL):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# One prompt, three responses of lengths 2, 1, 2; scores [1, 0, 0]; per-token KL (k1) with padding garbage 9.
MASK = torch.tensor([[1, 1], [1, 0], [1, 1]], dtype=torch.float32)
SCORES = torch.tensor([1.0, 0.0, 0.0])
KL = torch.tensor([[0.5, 1.5], [1.0, 9.0], [1.0, 2.0]])  # summed over valid tokens: 2, 1, 3
GROUP = torch.zeros(3, dtype=torch.long)


def advantages(name, kl_coef, **kw):
    token_rewards = kl_shaped_token_rewards(SCORES, KL, MASK, kl_coef)
    adv, _ = compute_advantages(name, scores=SCORES, mask=MASK, group_index=GROUP, token_rewards=token_rewards, **kw)
    return adv[:, 0]  # every estimator here puts one advantage on all of a response's tokens


def test_sequence_reward_is_the_score_minus_the_summed_kl():
    # R_i = s_i - beta * sum_t kl_t, beta = 0.5: [1 - 1, 0 - 0.5, 0 - 1.5] = [0, -0.5, -1.5] (padding ignored).
    rewards = sequence_rewards(SCORES, kl_shaped_token_rewards(SCORES, KL, MASK, 0.5), MASK)
    close(rewards, [0.0, -0.5, -1.5])
    close(sequence_rewards(SCORES, None, MASK), SCORES)


def test_drgrpo_uses_kl_shaped_rewards():
    # beta = 0: R = [1, 0, 0], mean 1/3, A = [2/3, -1/3, -1/3].
    # beta = 0.5: R = [0, -0.5, -1.5], mean -2/3, A = R - mean = [2/3, 1/6, -5/6].
    close(advantages("drgrpo", 0.0), [2 / 3, -1 / 3, -1 / 3])
    close(advantages("drgrpo", 0.5), [2 / 3, 1 / 6, -5 / 6])


def test_grpo_uses_kl_shaped_rewards():
    # beta = 0.5: deviations [2/3, 1/6, -5/6]; unbiased var = (16/36 + 1/36 + 25/36) / 2 = 7/12,
    # std = 0.763763: A = [0.872872, 0.218218, -1.091089]. (beta = 0: the plain GRPO [1.154701, -0.57735, ...].)
    close(advantages("grpo", 0.0), [1.154701, -0.577350, -0.577350])
    close(advantages("grpo", 0.5), [0.872872, 0.218218, -1.091089])


def test_rloo_uses_kl_shaped_rewards_inside_the_leave_one_out():
    # beta = 0.5, R = [0, -0.5, -1.5]: A_0 = 0 - (-0.5 - 1.5)/2 = 1; A_1 = -0.5 - (0 - 1.5)/2 = 0.25;
    # A_2 = -1.5 - (0 - 0.5)/2 = -1.25.  beta = 0: [1 - 0, 0 - 0.5, 0 - 0.5] = [1, -0.5, -0.5].
    close(advantages("rloo", 0.0), [1.0, -0.5, -0.5])
    close(advantages("rloo", 0.5), [1.0, 0.25, -1.25])


def test_remax_subtracts_the_greedy_baseline_from_the_kl_shaped_reward():
    # baseline b = 0.5 for the prompt: beta = 0: A = [0.5, -0.5, -0.5]; beta = 0.5: A = [0, -0.5, -1.5] - 0.5.
    b = torch.full((3,), 0.5)
    close(advantages("remax", 0.0, baseline_scores=b), [0.5, -0.5, -0.5])
    close(advantages("remax", 0.5, baseline_scores=b), [-0.5, -1.0, -2.0])


def test_remax_per_prompt_baselines_and_bad_input():
    # Two prompts (baselines 1 and 0), no KL: A = s - b = [1 - 1, 0 - 1, 1 - 0] on each valid token.
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]], dtype=torch.float32)
    adv, ret = compute_advantages("remax", scores=torch.tensor([1.0, 0.0, 1.0]), mask=mask,
                                  group_index=torch.tensor([0, 0, 1]), baseline_scores=torch.tensor([1.0, 1.0, 0.0]))
    close(adv, [[0.0, 0.0], [-1.0, 0.0], [1.0, 1.0]])
    close(ret, adv)
    with pytest.raises(ValueError, match="needs baseline_scores"):
        compute_advantages("remax", scores=SCORES, mask=MASK, group_index=GROUP)
    with pytest.raises(ValueError, match="baseline_scores must be"):
        compute_advantages("remax", scores=SCORES, mask=MASK, group_index=GROUP, baseline_scores=torch.zeros(2))


def passk(scores, k, groups=None):
    scores = torch.tensor(scores)
    groups = torch.zeros(len(scores), dtype=torch.long) if groups is None else torch.tensor(groups)
    adv, _ = compute_advantages("pass_at_k", scores=scores, mask=torch.ones(len(scores), 1), group_index=groups,
                                pass_k=k)
    return adv[:, 0]


def test_pass_at_1_is_grpo_with_the_population_std():
    # N = 4, one correct: R = 1 - C(3,1)/C(4,1) = 1/4, sigma = sqrt(1/4 * 3/4) = 0.433013.
    # correct: (1 - 1/4) / sigma = 1.732051; wrong: (1 - 1/4 - C(2,0)/C(3,0)) / sigma = -0.25 / sigma = -0.577350.
    close(passk([1.0, 0.0, 0.0, 0.0], 1), [1.732051, -0.577350, -0.577350, -0.577350])


def test_pass_at_2_by_hand():
    # N = 4, one correct (P), k = 2. The 6 pairs: 3 hold P (reward 1), 3 do not (reward 0): mean 0.5, std 0.5,
    # normalised pair advantages +1 / -1. P is only in rewarded pairs: A = +1. A wrong answer is in one pair with
    # P (+1) and two without (-1): A = -1/3. Closed form: R = 1 - C(3,2)/C(4,2) = 0.5; wrong:
    # (1 - 0.5 - C(2,1)/C(3,1)) / 0.5 = (0.5 - 2/3) / 0.5 = -1/3.
    close(passk([0.0, 1.0, 0.0, 0.0], 2), [-1 / 3, 1.0, -1 / 3, -1 / 3])


def test_pass_at_k_closed_form_matches_enumerating_the_subsets():
    # N = 5, two correct, k = 3: average each response's normalised subset rewards over its C(4, 2) = 6 subsets.
    scores = [1.0, 0.0, 1.0, 0.0, 0.0]
    subsets = list(itertools.combinations(range(5), 3))
    rewards = {s: max(scores[i] for i in s) for s in subsets}
    mean = sum(rewards.values()) / len(subsets)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards.values()) / len(subsets))
    expected = [sum((rewards[s] - mean) / std for s in subsets if i in s) / math.comb(4, 2) for i in range(5)]
    close(passk(scores, 3), expected)


def test_pass_at_k_uniform_groups_get_zero_and_groups_stay_apart():
    # group 0 all correct, group 1 all wrong: no signal (0, not NaN); group 2 as in test_pass_at_2_by_hand.
    adv = passk([1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0], 2, [0, 0, 1, 1, 2, 2, 2, 2])
    close(adv, [0.0, 0.0, 0.0, 0.0, -1 / 3, 1.0, -1 / 3, -1 / 3])


def test_pass_at_k_refuses_what_it_cannot_count():
    with pytest.raises(ValueError, match="exactly 0 or 1"):
        passk([1.0, 0.5], 1)
    with pytest.raises(ValueError, match="k <= group size"):
        passk([1.0, 0.0], 3)
    with pytest.raises(ValueError, match="cannot use KL-shaped token rewards"):
        compute_advantages("pass_at_k", scores=SCORES, mask=MASK, group_index=GROUP,
                           token_rewards=kl_shaped_token_rewards(SCORES, KL, MASK, 0.1), pass_k=2)
