"""Policy losses (PPO clip, dual clip, GSPO) and the clipped value loss, with hand-derived numbers."""

import math

import pytest
import torch

from reasonrl.algorithms import explained_variance, policy_loss, value_loss

ATOL = 1e-5


def close(actual, expected, atol=ATOL):
    actual = torch.as_tensor(actual)
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def with_ratios(ratios):
    """(log_probs leaf requiring grad, old_log_probs) such that pi / pi_old == ratios exactly (in float64)."""
    old = torch.full((1, len(ratios)), -1.0, dtype=torch.float64)
    new = (old + torch.log(torch.tensor([ratios], dtype=torch.float64))).requires_grad_(True)
    return new, old


def ppo(log_probs, old, adv, mask=None, **kw):
    kw.setdefault("clip_low", 0.2)
    kw.setdefault("clip_high", 0.28)
    kw.setdefault("clip_dual", 0.0)
    kw.setdefault("agg_mode", "token-mean")
    mask = torch.ones_like(old) if mask is None else mask
    return policy_loss("ppo_clip", log_probs=log_probs, old_log_probs=old, advantages=adv, mask=mask, **kw)


RATIOS = [0.5, 1.0, 1.2, 1.5]


def test_ppo_clip_positive_advantage_asymmetric_range():
    # A = +1, range (0.8, 1.28): loss = max(-r, -clip(r)).
    #   r=0.5 -> max(-0.5, -0.8)  = -0.5   (unclipped: pushing a low ratio up is allowed)
    #   r=1.0 -> -1.0
    #   r=1.2 -> max(-1.2, -1.2)  = -1.2   (inside the clip-higher range)
    #   r=1.5 -> max(-1.5, -1.28) = -1.28  clipped
    # token-mean = (-0.5 - 1 - 1.2 - 1.28) / 4 = -0.995; clip_frac = 1/4.
    lp, old = with_ratios(RATIOS)
    loss, metrics = ppo(lp, old, torch.ones_like(old))
    close(loss, -0.995)
    assert metrics["actor/clip_frac"] == pytest.approx(0.25)
    assert metrics["actor/dual_clip_frac"] == 0.0
    # ppo_kl = mean(old - new) = -(ln 0.5 + ln 1 + ln 1.2 + ln 1.5) / 4 = -ln(0.9) / 4 = 0.026340.
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(0.9) / 4, abs=1e-6)
    # Gradient of -A * r w.r.t. log pi is -A * r (r = exp(log pi - log pi_old)), divided by 4 tokens;
    # 0 where clipped: [-0.5/4, -1/4, -1.2/4, 0].
    loss.backward()
    close(lp.grad, [[-0.125, -0.25, -0.3, 0.0]])


def test_ppo_clip_symmetric_upper_boundary_is_not_counted_as_clipped():
    # clip_high = 0.2: r = 1.2 sits exactly on the boundary (-1.2 both ways) -> not clipped;
    # only r = 1.5 is. loss = (-0.5 - 1 - 1.2 - 1.2) / 4 = -0.975.
    lp, old = with_ratios(RATIOS)
    loss, metrics = ppo(lp, old, torch.ones_like(old), clip_high=0.2)
    close(loss, -0.975)
    assert metrics["actor/clip_frac"] == pytest.approx(0.25)


def test_ppo_clip_negative_advantage_lower_boundary():
    # A = -1, range (0.8, 1.28): loss = max(r, clip(r)).
    #   r=0.5 -> max(0.5, 0.8) = 0.8   clipped (pushing a low ratio further down is cut off)
    #   r=1.0 -> 1.0; r=1.2 -> 1.2; r=1.5 -> max(1.5, 1.28) = 1.5 (unclipped)
    # mean = (0.8 + 1 + 1.2 + 1.5) / 4 = 1.125; clip_frac 1/4; gradient -A * r / 4 = [0, 0.25, 0.3, 0.375].
    lp, old = with_ratios(RATIOS)
    loss, metrics = ppo(lp, old, -torch.ones_like(old))
    close(loss, 1.125)
    assert metrics["actor/clip_frac"] == pytest.approx(0.25)
    loss.backward()
    close(lp.grad, [[0.0, 0.25, 0.3, 0.375]])
    # Exactly on the lower boundary r = 0.8: max(0.8, 0.8) -> not clipped.
    lp, old = with_ratios([0.8])
    _, metrics = ppo(lp, old, -torch.ones_like(old))
    assert metrics["actor/clip_frac"] == 0.0


def test_dual_clip_bounds_negative_advantage_loss():
    # A = -1, ratios [0.5, 1.0, 1.5, 5.0], clip_dual 3:
    #   clipped-PPO losses [0.8, 1.0, 1.5, 5.0]; dual clip: min(loss, -A * 3 = 3) -> [0.8, 1.0, 1.5, 3.0]
    # mean = 6.3 / 4 = 1.575; clip_frac 1/4 (r=0.5), dual_clip_frac 1/4 (r=5); the dual-clipped
    # token gets no gradient: grad = [0, 1/4, 1.5/4, 0].
    lp, old = with_ratios([0.5, 1.0, 1.5, 5.0])
    loss, metrics = ppo(lp, old, -torch.ones_like(old), clip_dual=3.0)
    close(loss, 1.575)
    assert metrics["actor/clip_frac"] == pytest.approx(0.25)
    assert metrics["actor/dual_clip_frac"] == pytest.approx(0.25)
    loss.backward()
    close(lp.grad, [[0.0, 0.25, 0.375, 0.0]])
    # clip_dual 0 or 1 disables it: (0.8 + 1 + 1.5 + 5) / 4 = 2.075.
    for off in (0.0, 1.0):
        loss, metrics = ppo(lp.detach(), old, -torch.ones_like(old), clip_dual=off)
        close(loss, 2.075)
        assert metrics["actor/dual_clip_frac"] == 0.0


def test_dual_clip_leaves_positive_advantages_alone():
    # A = +1, r = 5: the ordinary clip gives -1.28; the dual clip only applies to A < 0.
    lp, old = with_ratios([5.0])
    loss, metrics = ppo(lp, old, torch.ones_like(old), clip_dual=3.0)
    close(loss, -1.28)
    assert metrics["actor/dual_clip_frac"] == 0.0
    assert metrics["actor/clip_frac"] == 1.0


def test_masked_tokens_do_not_count():
    # Append a padding token with an absurd ratio (e^100) and NaN advantage: the loss and metrics are
    # those of the 4 valid tokens (-0.995, clip_frac 1/4), its gradient is 0 and nothing is NaN.
    lp, old = with_ratios(RATIOS)
    lp_pad = torch.cat([lp.detach(), torch.tensor([[99.0]], dtype=torch.float64)], dim=1).requires_grad_(True)
    old_pad = torch.cat([old, torch.tensor([[-1.0]], dtype=torch.float64)], dim=1)
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0, float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)
    loss, metrics = ppo(lp_pad, old_pad, adv, mask=mask)
    close(loss, -0.995)
    assert metrics["actor/clip_frac"] == pytest.approx(0.25)
    loss.backward()
    close(lp_pad.grad, [[-0.125, -0.25, -0.3, 0.0, 0.0]])


def test_importance_weights_scale_the_per_token_loss():
    # Losses from the first test [-0.5, -1, -1.2, -1.28] times weights [2, 1, 1, 0.5]
    # = [-1, -1, -1.2, -0.64]; mean = -3.84 / 4 = -0.96.
    lp, old = with_ratios(RATIOS)
    weights = torch.tensor([[2.0, 1.0, 1.0, 0.5]], dtype=torch.float64)
    loss, _ = ppo(lp, old, torch.ones_like(old), is_weights=weights)
    close(loss, -0.96)


def test_policy_loss_aggregation_mode_is_applied():
    # Two sequences: [r=1, r=1, r=1] with A=+1 and [r=1, pad, pad] with A=-1 -> token losses
    # [[-1, -1, -1], [1, -, -]].
    #   token-mean: (-3 + 1) / 4 = -0.5
    #   seq-mean-token-mean: (-1 + 1) / 2 = 0
    #   seq-mean-token-sum-norm, norm_length 3: (-3/3 + 1/3) / 2 = -1/3
    old = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    expected = {"token-mean": -0.5, "seq-mean-token-mean": 0.0, "seq-mean-token-sum-norm": -1 / 3}
    for mode, value in expected.items():
        loss, _ = ppo(old.clone(), old, adv, mask=mask, agg_mode=mode, norm_length=3)
        close(loss, value)


def test_gspo_uses_one_sequence_ratio_and_its_own_clip_range():
    # Row 0 token log-ratios [0.2, 0, -0.05] (+ pad): mean 0.05 -> sequence ratio e^0.05 = 1.051271.
    #   A = +1, GSPO clip range 0.03: clip to 1.03, loss -1.03 on each of its 3 tokens, all clipped.
    # Row 1 log-ratios [-0.01, 0.01]: mean 0 -> ratio 1, A = -1: loss max(1, 1) = 1 on 2 tokens, unclipped.
    # seq-mean-token-mean: (-1.03 + 1) / 2 = -0.015; clip_frac 3/5; dual clip never applies.
    # ppo_kl = -(0.2 + 0 - 0.05 - 0.01 + 0.01) / 5 = -0.03 (token level).
    old = torch.full((2, 4), -2.0, dtype=torch.float64)
    log_ratio = torch.tensor([[0.2, 0.0, -0.05, 7.0], [-0.01, 0.01, 7.0, 7.0]], dtype=torch.float64)
    lp = (old + log_ratio).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4], dtype=torch.float64) * mask
    loss, metrics = policy_loss(
        "gspo",
        log_probs=lp,
        old_log_probs=old,
        advantages=adv,
        mask=mask,
        clip_low=0.03,
        clip_high=0.03,
        clip_dual=3.0,
        agg_mode="seq-mean-token-mean",
    )
    close(loss, -0.015)
    assert metrics["actor/clip_frac"] == pytest.approx(0.6)
    assert metrics["actor/dual_clip_frac"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.03, abs=1e-6)
    # Gradient: row 0 is clipped -> 0. Row 1 token loss -A * s with d s / d log pi_t = s = 1 (stop-gradient
    # trick), averaged over 2 tokens and 2 rows: 1 * 1/2 * 1/2 = 0.25 per token. That equals the gradient
    # of the sequence objective -A * exp(mean_t log-ratio): s / |y| = 1/2, over 2 rows -> 0.25.
    loss.backward()
    close(lp.grad, [[0.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.0, 0.0]])


def test_gspo_ignores_token_level_outliers_that_ppo_would_clip():
    # Token log-ratios [ln 2, -ln 2]: PPO clips both tokens (ratios 2 and 0.5 with A = +1: the 2 is clipped,
    # 0.5 is not) while GSPO sees the sequence ratio exp(0) = 1 and clips nothing; loss -1.
    old = torch.zeros(1, 2)
    lp = torch.tensor([[math.log(2), -math.log(2)]])
    kwargs = dict(old_log_probs=old, advantages=torch.ones(1, 2), mask=torch.ones(1, 2), clip_low=0.2, clip_high=0.2)
    gspo_loss, gspo_metrics = policy_loss("gspo", log_probs=lp, agg_mode="token-mean", **kwargs)
    _, ppo_metrics = policy_loss("ppo_clip", log_probs=lp, agg_mode="token-mean", **kwargs)
    close(gspo_loss, -1.0)
    assert gspo_metrics["actor/clip_frac"] == 0.0
    assert ppo_metrics["actor/clip_frac"] == 0.5


def test_policy_loss_bad_input():
    x = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="unknown policy loss"):
        policy_loss("nope", log_probs=x, old_log_probs=x, advantages=x, mask=x, clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="shape mismatch"):
        policy_loss(
            "ppo_clip", log_probs=x, old_log_probs=torch.zeros(1, 2), advantages=x, mask=x, clip_low=0.2, clip_high=0.2
        )
    with pytest.raises(ValueError, match="unknown loss aggregation mode"):
        policy_loss(
            "ppo_clip", log_probs=x, old_log_probs=x, advantages=x, mask=x, clip_low=0.2, clip_high=0.2, agg_mode="x"
        )


def test_value_loss_clipped_by_hand():
    # cliprange 0.2, last token is padding.
    #   t0: V=1, V_old=0.5 -> V_clip = 0.7; (1-2)^2 = 1 vs (0.7-2)^2 = 1.69 -> 0.5 * 1.69 = 0.845 (clip active)
    #   t1: V=2, V_old=2   -> V_clip = 2;   (2-1)^2 = 1 vs 1                -> 0.5                (not active)
    #   t2: V=0, V_old=0.5 -> V_clip = 0.3; (0-0)^2 = 0 vs 0.09             -> 0.045 (clip active)
    # token-mean = (0.845 + 0.5 + 0.045) / 3 = 0.463333; vf_clip_frac = 2/3.
    values = torch.tensor([[1.0, 2.0, 0.0, 5.0]], requires_grad=True)
    old_values = torch.tensor([[0.5, 2.0, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = value_loss(values, old_values, returns, mask, cliprange=0.2)
    close(loss, 0.463333)
    assert metrics["critic/vf_clip_frac"] == pytest.approx(2 / 3)
    assert metrics["critic/vpred_mean"] == pytest.approx(1.0)  # (1 + 2 + 0) / 3
    # Where the clipped branch wins and the clamp saturates, no gradient; t1: (V - R) / 3 = 1/3.
    loss.backward()
    close(values.grad, [[0.0, 1 / 3, 0.0, 0.0]])


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # Perfect critic -> 1.
    assert explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)
    # Constant V = 2: residual [-1, 0, 1] has the variance of the returns -> 0.
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)
    # V = [1.5, 2, 2.5]: residual [-0.5, 0, 0.5], var 0.25 vs var(R) = 1 -> 0.75 (pad ignored).
    values = torch.tensor([[1.5, 2.0, 2.5, -7.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(0.75)
    # Constant returns: undefined, reported as 0.
    assert explained_variance(values, torch.ones(1, 4), mask) == 0.0
