"""CISPO, SAPO, GMPO, Clip-Cov, KL-Cov, the policy-loss options and seq-mean-token-sum; numbers derived by hand."""

import math

import pytest
import torch

from reasonrl.algorithms import (
    LOSS_AGG_MODES,
    POLICY_LOSS_OPTIONS,
    POLICY_LOSSES,
    agg_denominator,
    aggregate_loss,
    policy_loss,
    register_policy_loss,
    resolve_policy_loss_options,
)

ATOL = 1e-5


def close(actual, expected, atol=ATOL):
    actual = torch.as_tensor(actual)
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def with_log_ratios(log_ratios, old=-1.0):
    """(log_probs leaf requiring grad, old_log_probs) with log(pi / pi_old) == log_ratios, float64, one row."""
    old_lp = torch.full((1, len(log_ratios)), old, dtype=torch.float64)
    return (old_lp + torch.tensor([log_ratios], dtype=torch.float64)).requires_grad_(True), old_lp


def run(name, lp, old, adv, mask=None, **kw):
    kw.setdefault("clip_low", 0.2)
    kw.setdefault("clip_high", 0.28)
    kw.setdefault("agg_mode", "token-mean")
    mask = torch.ones_like(old) if mask is None else mask
    return policy_loss(name, log_probs=lp, old_log_probs=old, advantages=adv, mask=mask, **kw)


LN2, LN15 = math.log(2), math.log(1.5)


def test_cispo_truncates_the_weight_but_keeps_every_gradient():
    # ratios [0.5, 1, 1.5], old log-prob -1: log pi = [-1 - ln 2, -1, -1 + ln 1.5] = [-1.693147, -1, -0.594535].
    # A = +1, cap 1 + 0.28: w = [0.5, 1, 1.28]; loss_t = -w A log pi = [0.846574, 1, 0.761005], mean 0.869193.
    # gradient -w A / 3 = [-0.166667, -0.333333, -0.426667]: the capped token still learns (PPO would give it 0).
    lp, old = with_log_ratios([-LN2, 0.0, LN15])
    loss, metrics = run("cispo", lp, old, torch.ones_like(old))
    close(loss, (0.5 * (1 + LN2) + 1.0 + 1.28 * (1 - LN15)) / 3)
    assert metrics["actor/clip_frac"] == pytest.approx(1 / 3)
    loss.backward()
    close(lp.grad, [[-0.5 / 3, -1 / 3, -1.28 / 3]])
    # weight_min 0.6 lifts the low weight: gradient [-0.2, -1/3, -0.426667], two of three truncated.
    lp2 = lp.detach().clone().requires_grad_(True)
    loss, metrics = run("cispo", lp2, old, torch.ones_like(old), options={"weight_min": 0.6})
    loss.backward()
    close(lp2.grad, [[-0.2, -1 / 3, -1.28 / 3]])
    assert metrics["actor/clip_frac"] == pytest.approx(2 / 3)
    # A = -1 flips the gradient's sign; clip_low is not used by CISPO (same result for any clip_low).
    for clip_low in (0.0, 0.9):
        lp3 = lp.detach().clone().requires_grad_(True)
        run("cispo", lp3, old, -torch.ones_like(old), clip_low=clip_low)[0].backward()
        close(lp3.grad, [[0.5 / 3, 1 / 3, 1.28 / 3]])


def test_sapo_soft_gate_by_hand():
    # A = +1, tau_pos = 1: gate(r) = sigmoid(r - 1) * 4. r = 1: 2; r = 2: 4 * 0.731059 = 2.924234.
    # loss = mean(-2, -2.924234) = -2.462117. d loss_t / d log pi_t = -A * 4 s (1 - s) * r:
    # r = 1: -1; r = 2: -4 * 0.731059 * 0.268941 * 2 = -1.572896; over 2 tokens: [-0.5, -0.786448].
    lp, old = with_log_ratios([0.0, LN2])
    loss, metrics = run("sapo", lp, old, torch.ones_like(old))
    close(loss, -(2.0 + 4 * 0.7310586) / 2)
    loss.backward()
    close(lp.grad, [[-0.5, -0.7864477]])
    assert metrics["actor/clip_frac"] == 0.0  # slope 4 s (1 - s) = 0.786 at r = 2 is still >= 0.5


def test_sapo_negative_advantages_use_tau_neg_and_larger_tau_decays_faster():
    # A = -1, tau_neg = 1.05, r = 1: gate = 0.5 * 4 / 1.05 = 1.904762, loss = +1.904762, gradient exactly 1
    # (4 * 0.25 at r = 1 whatever tau: SAPO is the policy gradient on-policy).
    lp, old = with_log_ratios([0.0])
    loss, _ = run("sapo", lp, old, -torch.ones_like(old))
    close(loss, 2 / 1.05)
    loss.backward()
    close(lp.grad, [[1.0]])
    # r = 1.5, A = -1: tau 1 -> s = sigmoid(0.5) = 0.622459, gradient 4 s (1 - s) * 1.5 = 1.410021;
    # tau 10 -> s = sigmoid(5) = 0.993307, gradient 4 s (1 - s) * 1.5 = 0.039888, and its slope is < 0.5: counted.
    for tau, expected, frac in ((1.0, 1.410021, 0.0), (10.0, 0.039888, 1.0)):
        lp, old = with_log_ratios([LN15])
        loss, metrics = run("sapo", lp, old, -torch.ones_like(old), options={"tau_neg": tau})
        loss.backward()
        close(lp.grad, [[expected]])
        assert metrics["actor/clip_frac"] == frac


def test_gmpo_geometric_mean_with_one_sided_log_clip():
    # log ratios [0.6, -0.1, -0.5], clip 0.4 / 0.4 in log space.
    # A = +1: min(l, clip(l)) = [0.4 (clipped), -0.1, -0.5 (a low ratio is not cut for A > 0)]; mean -0.2/3,
    #   G = exp(-0.066667) = 0.935507, loss -0.935507; gradient -G / 3 on the unclipped tokens: [0, -0.311836, x2].
    lp, old = with_log_ratios([0.6, -0.1, -0.5])
    loss, metrics = run("gmpo", lp, old, torch.ones_like(old), clip_low=0.4, clip_high=0.4,
                        agg_mode="seq-mean-token-mean")
    g = math.exp(-0.2 / 3)
    close(loss, -g)
    assert metrics["actor/clip_frac"] == pytest.approx(1 / 3)
    loss.backward()
    close(lp.grad, [[0.0, -g / 3, -g / 3]])
    # A = -1: max(l, clip(l)) = [0.6, -0.1, -0.4 (clipped)]; mean 0.1/3, G = exp(0.033333) = 1.033895,
    #   loss +G, gradient +G/3 on the unclipped tokens.
    lp, old = with_log_ratios([0.6, -0.1, -0.5])
    loss, _ = run("gmpo", lp, old, -torch.ones_like(old), clip_low=0.4, clip_high=0.4, agg_mode="seq-mean-token-mean")
    g = math.exp(0.1 / 3)
    close(loss, g)
    loss.backward()
    close(lp.grad, [[g / 3, g / 3, 0.0]])


def test_gmpo_is_per_sequence_and_ignores_padding():
    # Row 0 as above with A = +1 (-0.935507); row 1: log ratios [0, 0] + a padding token with log ratio 50,
    # A = -1: G = 1, loss 1. seq-mean-token-mean: (-0.935507 + 1) / 2 = 0.032247.
    old = torch.full((2, 3), -1.0, dtype=torch.float64)
    lp = old + torch.tensor([[0.6, -0.1, -0.5], [0.0, 0.0, 50.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=torch.float64)
    loss, _ = run("gmpo", lp, old, adv, mask=mask, clip_low=0.4, clip_high=0.4, agg_mode="seq-mean-token-mean")
    close(loss, (1 - math.exp(-0.2 / 3)) / 2)


# Clip-Cov / KL-Cov: one row of 4 valid tokens, log pi = [-1, -1, -3, -3] (mean -2).
COV_LP = [-1.0, -1.0, -3.0, -3.0]


def cov_inputs(adv, log_ratios=(0.0, 0.0, 0.0, 0.0)):
    lp = torch.tensor([COV_LP], dtype=torch.float64).requires_grad_(True)
    old = lp.detach() - torch.tensor([log_ratios], dtype=torch.float64)
    return lp, old, torch.tensor([adv], dtype=torch.float64)


def test_clip_cov_detaches_the_high_covariance_tokens():
    # A = [2, -2, 2, -2] (mean 0): cov = (lp + 2) * A = [2, -2, -2, 2]; inside (1, 5): tokens 0 and 3.
    # ratio 1: PPO losses -A = [-2, 2, -2, 2], mean 0; gradient -A / 4 = [-0.5, 0.5, -0.5, 0.5].
    # clip_cov_ratio 0.5: max(1, int(0.5 * 4)) = 2 tokens -> both candidates detached: gradient [0, 0.5, -0.5, 0].
    lp, old, adv = cov_inputs([2.0, -2.0, 2.0, -2.0])
    loss, metrics = run("clip_cov", lp, old, adv, clip_high=0.2, options={"clip_cov_ratio": 0.5})
    close(loss, 0.0)  # a detached token keeps its value
    loss.backward()
    close(lp.grad, [[0.0, 0.5, -0.5, 0.0]])
    assert metrics["actor/cov_selected_frac"] == 0.5
    # clip_cov_ub 1.5: no token has 1 < cov < 1.5 -> plain PPO gradient.
    lp, old, adv = cov_inputs([2.0, -2.0, 2.0, -2.0])
    run("clip_cov", lp, old, adv, options={"clip_cov_ratio": 0.5, "clip_cov_ub": 1.5})[0].backward()
    close(lp.grad, [[-0.5, 0.5, -0.5, 0.5]])


def test_clip_cov_skips_clipped_tokens_and_draws_at_random():
    # Token 0 gets ratio 2 with A = +2: PPO clips it (gradient 0) and it is no candidate; only token 3 is detached.
    lp, old, adv = cov_inputs([2.0, -2.0, 2.0, -2.0], log_ratios=(LN2, 0.0, 0.0, 0.0))
    run("clip_cov", lp, old, adv, clip_high=0.2, options={"clip_cov_ratio": 0.5})[0].backward()
    close(lp.grad, [[0.0, 0.5, -0.5, 0.0]])
    # Default ratio 2e-4: max(1, int(0.0008)) = 1 of the two candidates {0, 3}, drawn at random.
    torch.manual_seed(0)
    picked = set()
    for _ in range(20):
        lp, old, adv = cov_inputs([2.0, -2.0, 2.0, -2.0])
        run("clip_cov", lp, old, adv)[0].backward()
        zero = [i for i in range(4) if lp.grad[0, i] == 0]
        assert len(zero) == 1 and zero[0] in (0, 3)
        picked.add(zero[0])
    assert picked == {0, 3}


def test_kl_cov_penalises_the_top_covariance_token():
    # A = [3, -2, 2, -1] (mean 0.5): cov = (lp + 2)(A - 0.5) = [2.5, -2.5, -1.5, 1.5] -> top-1 is token 0.
    # log ratios [0.2, 0, 0, 0]: token 0 loss -3 e^0.2 + 1 * 0.2 = -3.464208; the others -A = [2, -2, 1].
    # kl_cov_ratio 0.25 -> max(1, int(1)) = 1 token. mean = (-3.464208 + 1) / 4 = -0.616052.
    # gradient: token 0: (-3 e^0.2 + 1) / 4 = -0.666052; others -A / 4 = [0.5, -0.5, 0.25].
    lp, old, adv = cov_inputs([3.0, -2.0, 2.0, -1.0], log_ratios=(0.2, 0.0, 0.0, 0.0))
    loss, metrics = run("kl_cov", lp, old, adv, options={"kl_cov_ratio": 0.25})
    close(loss, (-3 * math.exp(0.2) + 0.2 + 1.0) / 4)
    assert metrics["actor/cov_selected_frac"] == 0.25
    loss.backward()
    close(lp.grad, [[(-3 * math.exp(0.2) + 1) / 4, 0.5, -0.5, 0.25]])
    # kl_cov_ratio 0 turns the penalty off: token 0's gradient is -3 e^0.2 / 4 = -0.916052; never clipped.
    lp, old, adv = cov_inputs([3.0, -2.0, 2.0, -1.0], log_ratios=(0.2, 0.0, 0.0, 0.0))
    loss, metrics = run("kl_cov", lp, old, adv, options={"kl_cov_ratio": 0.0})
    loss.backward()
    close(lp.grad[0, 0], -3 * math.exp(0.2) / 4)
    assert metrics["actor/clip_frac"] == 0.0 and metrics["actor/cov_selected_frac"] == 0.0


def test_options_are_checked_per_loss():
    assert resolve_policy_loss_options("sapo", {"tau_neg": 2}) == {"tau_pos": 1.0, "tau_neg": 2.0}
    with pytest.raises(ValueError, match=r"policy loss 'sapo' has no option 'tau'; its options: tau_neg, tau_pos"):
        resolve_policy_loss_options("sapo", {"tau": 1.0})
    with pytest.raises(ValueError, match="policy loss 'ppo_clip' has no option 'tau_pos'; its options: none"):
        resolve_policy_loss_options("ppo_clip", {"tau_pos": 1.0})
    with pytest.raises(ValueError, match="must be a finite number"):
        resolve_policy_loss_options("kl_cov", {"kl_cov_coef": float("inf")})
    lp, old = with_log_ratios([0.0])
    with pytest.raises(ValueError, match="has no option"):
        run("gmpo", lp, old, torch.ones_like(old), options={"clip_cov_ratio": 0.1})
    with pytest.raises(ValueError, match="tau_pos and tau_neg must be > 0"):
        run("sapo", lp, old, torch.ones_like(old), options={"tau_pos": 0.0})


def test_a_registered_loss_declares_its_options():
    @register_policy_loss("test_scaled", options={"scale": 2.0})
    def scaled(*, log_probs, advantages, mask, options, **unused):
        return aggregate_loss(-options["scale"] * advantages * log_probs, mask), {}

    try:
        lp, old = with_log_ratios([0.0, 0.0])  # log pi = -1: loss = -scale * 1 * -1 = scale
        close(run("test_scaled", lp, old, torch.ones_like(old))[0], 2.0)
        close(run("test_scaled", lp, old, torch.ones_like(old), options={"scale": 3})[0], 3.0)
    finally:
        POLICY_LOSSES.unregister("test_scaled")
        POLICY_LOSS_OPTIONS.pop("test_scaled")


# Rows: [1, 2, 3 | pad NaN], [4 | pad], and an empty row.
LOSS = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [4.0, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)


def test_seq_mean_token_sum():
    # Row sums 6 and 4; the empty row is left out: (6 + 4) / 2 = 5.
    close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum"), 5.0)
    close(aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), "seq-mean-token-sum"), 0.0)


def test_denominators_recombine_micro_batches_for_every_mode():
    # What aggregate_loss divides by: 4 valid tokens; 2 non-empty rows (seq-mean-*); all 3 rows (sum-norm).
    expected = {"token-mean": 4, "seq-mean-token-mean": 2, "seq-mean-token-sum": 2, "seq-mean-token-sum-norm": 3}
    assert set(expected) == set(LOSS_AGG_MODES)
    for mode, denom in expected.items():
        assert int(agg_denominator(MASK, mode)) == denom
        # Rows {0} and {1, 2} as two micro-batches: weighting each one's loss by its share of the denominator
        # gives the whole batch's loss.
        parts = [(LOSS[:1], MASK[:1]), (LOSS[1:], MASK[1:])]
        total = sum(aggregate_loss(lm, m, mode, 4) * agg_denominator(m, mode) / denom for lm, m in parts)
        close(total, aggregate_loss(LOSS, MASK, mode, 4))
    with pytest.raises(ValueError, match="unknown loss aggregation mode"):
        agg_denominator(MASK, "sum")


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_on_policy_every_loss_gives_the_policy_gradient(name):
    # pi = pi_old (ratio 1, one update per batch): CISPO's weight is 1, SAPO's gate slope 1, GMPO's G = 1 with
    # d G / d log pi_t = 1/|y|, no clip acts and KL-Cov's |log r| = 0 has gradient 0. With seq-mean-token-mean each
    # loss's gradient is then the policy gradient -A_t / |y_i| / (number of rows): row 0 (3 tokens, A = 1.5):
    # -0.25 each; row 1 (2 tokens + padding, A = -0.5): +0.125 each.
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, 0.0]], dtype=torch.float64)
    lp = old.clone().requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    adv = torch.tensor([[1.5] * 3, [-0.5] * 3], dtype=torch.float64) * mask
    options = {"clip_cov_ratio": 0.0} if name == "clip_cov" else None
    run(name, lp, old, adv, mask=mask, agg_mode="seq-mean-token-mean", options=options)[0].backward()
    close(lp.grad, [[-0.25, -0.25, -0.25], [0.125, 0.125, 0.0]])
