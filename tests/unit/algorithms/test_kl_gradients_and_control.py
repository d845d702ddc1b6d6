"""Which gradient each KL estimator gives in the reward and in the loss (exact, by enumerating a 4-outcome policy),
and the KL coefficient controllers."""

import pytest
import torch

from reasonrl.algorithms import AdaptiveKLController, FixedKLController, kl_penalty, make_kl_controller

# pi = softmax(theta) over 4 outcomes, the reference q = softmax(ref_logits); float64 so the identities hold to 1e-12.
THETA = torch.tensor([0.3, -1.2, 0.8, 0.1], dtype=torch.float64)
REF_LOGITS = torch.tensor([-0.5, 0.4, 0.2, 1.0], dtype=torch.float64)


def close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-10, rtol=0)


def grad_of(fn):
    theta = THETA.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(theta), theta)
    return grad


def kl(p_log, q_log):
    """KL(p || q) = sum_y p(y) (log p(y) - log q(y))."""
    return (p_log.exp() * (p_log - q_log)).sum()


Q_LOG = torch.log_softmax(REF_LOGITS, -1)
GRAD_KL_PI_REF = grad_of(lambda th: kl(torch.log_softmax(th, -1), Q_LOG))  # grad KL(pi || ref)
GRAD_KL_REF_PI = grad_of(lambda th: kl(Q_LOG, torch.log_softmax(th, -1)))  # grad KL(ref || pi)


def score_function_gradient(estimator):
    """E_{y~pi}[k(y) * grad log pi(y)], the sum over the 4 outcomes (the estimate k held fixed, as a reward is)."""
    log_pi = torch.log_softmax(THETA, -1)
    k = kl_penalty(log_pi[None], Q_LOG[None], estimator)[0].detach()
    return grad_of(lambda th: (log_pi.exp().detach() * k * torch.log_softmax(th, -1)).sum())


def pathwise_gradient(estimator):
    """E_{y~pi}[grad k(y)] with the samples' distribution held fixed (what a KL loss term on sampled tokens does)."""
    weights = torch.softmax(THETA, -1).detach()
    return grad_of(lambda th: (weights * kl_penalty(torch.log_softmax(th, -1)[None], Q_LOG[None], estimator)[0]).sum())


def test_the_two_kl_gradients_differ_on_this_policy():
    # Otherwise the assertions below could not tell them apart.
    assert (GRAD_KL_PI_REF - GRAD_KL_REF_PI).abs().max() > 0.05


def test_k1_in_the_reward_gives_the_gradient_of_kl_pi_ref():
    # KL = sum pi log(pi/q); grad KL = sum grad(pi) log(pi/q) + sum pi grad log pi
    #        = E_pi[log(pi/q) grad log pi] + grad(sum pi) = E_pi[k1 grad log pi] + 0.
    close(score_function_gradient("k1"), GRAD_KL_PI_REF)


def test_k3_in_the_reward_gives_a_different_gradient():
    # k3 = q/pi - log(q/pi) - 1 = q/pi + k1 - 1:
    # E_pi[k3 grad log pi] = sum q grad log pi + E_pi[k1 grad log pi] - sum pi grad log pi
    #                      = -grad KL(q || pi) + grad KL(pi || q) - 0       (grad KL(q||pi) = -sum q grad log pi).
    k3 = score_function_gradient("k3")
    close(k3, GRAD_KL_PI_REF - GRAD_KL_REF_PI)
    assert (k3 - GRAD_KL_PI_REF).abs().max() > 0.05


def test_in_the_loss_k3_gives_kl_ref_pi_k2_gives_kl_pi_ref_and_k1_nothing():
    # Pathwise, samples fixed: grad k1 = grad log pi, E_pi[grad log pi] = grad sum pi = 0.
    # grad k2 = (log pi - log q) grad log pi: E_pi = E_pi[k1 grad log pi] = grad KL(pi || q).
    # grad k3 = (1 - q/pi) grad log pi: E_pi = 0 - sum q grad log pi = grad KL(q || pi).
    close(pathwise_gradient("k1"), torch.zeros(4, dtype=torch.float64))
    close(pathwise_gradient("k2"), GRAD_KL_PI_REF)
    close(pathwise_gradient("k3"), GRAD_KL_REF_PI)


def test_adaptive_controller_follows_ziegler_by_hand():
    # coef 0.1, target 0.05, horizon 100; coef <- coef * (1 + clip(kl/target - 1, -0.2, 0.2) * n / horizon).
    ctrl = AdaptiveKLController(0.1, target=0.05, horizon=100)
    assert ctrl.update(0.06, 10) == pytest.approx(0.1 * (1 + 0.2 * 0.1))        # error 0.2 -> 0.102
    assert ctrl.update(0.5, 10) == pytest.approx(0.102 * 1.02)                   # error 9 clipped to 0.2 -> 0.10404
    assert ctrl.update(0.0, 50) == pytest.approx(0.10404 * (1 - 0.2 * 0.5))      # error -1 clipped: 0.093636
    assert ctrl.update(0.045, 100) == pytest.approx(0.093636 * 0.9)             # error -0.1, n = horizon: 0.0842724
    assert ctrl.update(0.05, 100) == pytest.approx(0.0842724)                    # on target: unchanged
    assert ctrl.kl_coef == pytest.approx(0.0842724)


def test_controller_state_round_trip_continues_identically():
    a = AdaptiveKLController(0.2, target=0.1, horizon=1000)
    a.update(0.3, 64)
    b = AdaptiveKLController(0.2, target=0.1, horizon=1000)
    b.load_state_dict(a.state_dict())
    assert a.state_dict() == b.state_dict() == {"kl_coef": pytest.approx(0.2 * (1 + 0.2 * 0.064))}
    assert a.update(0.02, 64) == b.update(0.02, 64)
    with pytest.raises(ValueError, match="needs 'kl_coef'"):
        b.load_state_dict({"coef": 1.0})


def test_fixed_controller_and_factory():
    fixed = make_kl_controller("fixed", 0.001, target=0.1, horizon=10)
    assert isinstance(fixed, FixedKLController) and not isinstance(fixed, AdaptiveKLController)
    assert fixed.update(100.0, 1000) == 0.001 and fixed.state_dict() == {"kl_coef": 0.001}
    assert isinstance(make_kl_controller("adaptive", 0.001, target=0.1, horizon=10), AdaptiveKLController)
    with pytest.raises(ValueError, match="unknown KL controller 'pid'"):
        make_kl_controller("pid", 0.001, 0.1, 10)
    with pytest.raises(ValueError, match="kl_target must be a finite number > 0"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError, match="current_kl must be a finite number"):
        AdaptiveKLController(0.1, target=0.1, horizon=10).update(float("nan"), 1)
