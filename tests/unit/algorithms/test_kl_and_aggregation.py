"""KL estimators, loss aggregation, log-probs/entropy from logits, and the algorithms package's imports."""

import ast
import math
from pathlib import Path

import pytest
import torch

import reasonrl.algorithms as algorithms
from reasonrl.algorithms import aggregate_loss, entropy_from_logits, kl_penalty, log_probs_from_logits

ATOL = 1e-5
LN2 = math.log(2)


def close(actual, expected, atol=ATOL):
    actual = torch.as_tensor(actual)
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# ----------------------------------------------------------------------------- KL


def test_kl_estimators_on_one_token():
    # pi = 0.5, pi_ref = 0.25 at the sampled token.
    #   k1 = ln 0.5 - ln 0.25 = ln 2 = 0.693147
    #   k2 = 0.5 * (ln 2)^2 = 0.240227
    #   k3 = r = ln(0.25 / 0.5) = -ln 2: exp(r) - r - 1 = 0.5 + 0.693147 - 1 = 0.193147
    lp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    close(kl_penalty(lp, ref, "k1"), [[LN2]])
    close(kl_penalty(lp, ref, "k2"), [[0.5 * LN2**2]])
    close(kl_penalty(lp, ref, "k3"), [[0.5 + LN2 - 1]])
    # verl's names map to the same estimators.
    close(kl_penalty(lp, ref, "low_var_kl"), kl_penalty(lp, ref, "k3"))
    close(kl_penalty(lp, ref, "kl"), kl_penalty(lp, ref, "k1"))
    close(kl_penalty(lp, ref, "mse"), kl_penalty(lp, ref, "k2"))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_is_zero_for_identical_policies(estimator):
    lp = torch.log(torch.tensor([[0.1, 0.7, 0.2]]))
    close(kl_penalty(lp, lp.clone(), estimator), torch.zeros(1, 3))


def test_k1_and_k3_are_unbiased_in_expectation():
    # p = [0.5, 0.25, 0.25] (actor), q = [0.25, 0.25, 0.5] (reference):
    # KL(p || q) = 0.5 ln 2 + 0.25 ln 1 + 0.25 ln 0.5 = 0.25 ln 2 = 0.173287.
    # E_{y~p}[k1] = KL by definition; E_p[k3] = sum p (q/p) - E_p[ln q/p] - 1 = 1 + KL - 1 = KL.
    p = torch.tensor([0.5, 0.25, 0.25])
    q = torch.tensor([0.25, 0.25, 0.5])
    for estimator in ("k1", "k3"):
        per_token = kl_penalty(p.log()[None], q.log()[None], estimator)[0]
        close((p * per_token).sum(), 0.25 * LN2)


def test_k3_stays_finite_and_clamped_far_from_the_reference():
    # r = ref - lp = +100: e^100 = 2.7e43 overflows float32 (max 3.4e38); r is clamped to 20 and k3 to at
    # most 10. r = -60 -> clamped to -20: exp(-20) + 20 - 1 = 19 -> clamped to 10 as well. r = 0 -> 0.
    lp = torch.tensor([[-100.0, 0.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -60.0, -1.0]])
    k3 = kl_penalty(lp, ref, "k3")
    close(k3, [[10.0, 10.0, 0.0]])
    k3.sum().backward()
    assert torch.isfinite(lp.grad).all()


def test_kl_bad_input():
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), "k4")
    with pytest.raises(ValueError, match="shape mismatch"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 3), "k1")


# ----------------------------------------------------------------------------- aggregation

# Rows: [1, 2, 3 | pad NaN], [4 | pad], and an empty row (no valid token).
LOSS = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [4.0, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)


def test_token_mean():
    # (1 + 2 + 3 + 4) / 4 valid tokens = 2.5; NaN padding and the empty row do not matter.
    close(aggregate_loss(LOSS, MASK, "token-mean"), 2.5)


def test_seq_mean_token_mean():
    # Row means 2 and 4; the empty row is left out: (2 + 4) / 2 = 3.
    close(aggregate_loss(LOSS, MASK, "seq-mean-token-mean"), 3.0)


def test_seq_mean_token_sum_norm():
    # Row sums 6, 4, 0 divided by norm_length, then the mean over all B = 3 rows.
    #   norm_length 4 (also the default, T = 4): (1.5 + 1 + 0) / 3 = 0.833333
    #   norm_length 2: (3 + 2 + 0) / 3 = 1.666667
    close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=4), 2.5 / 3)
    close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm"), 2.5 / 3)
    close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=2), 5 / 3)


def test_aggregation_gradient_skips_padding():
    # token-mean gradient: 1/4 on each of the 4 valid tokens, exactly 0 (not NaN) elsewhere.
    loss_mat = LOSS.clone().requires_grad_(True)
    aggregate_loss(loss_mat, MASK.bool(), "token-mean").backward()
    close(loss_mat.grad, MASK / 4)


def test_all_masked_batch_gives_zero():
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        close(aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), mode), 0.0)


def test_aggregation_bad_input():
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'sum'"):
        aggregate_loss(torch.ones(1, 2), torch.ones(1, 2), "sum")
    with pytest.raises(ValueError, match="shape mismatch"):
        aggregate_loss(torch.ones(1, 2), torch.ones(1, 3))
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum-norm", norm_length=0)


# ----------------------------------------------------------------------------- log-probs and entropy


def test_log_prob_and_entropy_by_hand():
    # logits [0, ln 3] -> softmax [0.25, 0.75]: log p(1) = ln 0.75 = -0.287682, log p(0) = ln 0.25.
    # entropy = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335.
    # Shifting all logits by 1000 changes nothing (and must not overflow).
    for shift in (0.0, 1000.0):
        logits = torch.tensor([[[0.0, math.log(3)], [0.0, math.log(3)]]]) + shift
        lp = log_probs_from_logits(logits, torch.tensor([[1, 0]]))
        close(lp, [[math.log(0.75), math.log(0.25)]], atol=1e-4)
        close(entropy_from_logits(logits), [[0.562335, 0.562335]], atol=1e-4)
    # Uniform over 4 tokens: entropy ln 4 = 1.386294.
    close(entropy_from_logits(torch.zeros(3, 4)), [math.log(4)] * 3)


def test_chunked_equals_unchunked_with_gradients():
    # 2 x 5 = 10 rows in chunks of 3 (not a divisor) must give the same values and gradients.
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5))
    full = log_probs_from_logits(logits, labels)
    (grad_full,) = torch.autograd.grad(full.sum(), logits)
    chunked = log_probs_from_logits(logits, labels, chunk_size=3)
    (grad_chunked,) = torch.autograd.grad(chunked.sum(), logits)
    close(chunked, full)
    close(grad_chunked, grad_full)
    close(entropy_from_logits(logits, chunk_size=3), entropy_from_logits(logits))
    # The gradient of sum_t log p(label_t) w.r.t. the logits is onehot - softmax.
    expected = torch.nn.functional.one_hot(labels, 11).float() - torch.softmax(logits.detach(), -1)
    close(grad_full, expected)


def test_bf16_logits_give_float32_results():
    logits = torch.randn(1, 3, 7).to(torch.bfloat16)
    labels = torch.tensor([[0, 3, 6]])
    lp = log_probs_from_logits(logits, labels, chunk_size=2)
    assert lp.dtype == torch.float32
    expected = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None])[..., 0]
    close(lp, expected)
    assert entropy_from_logits(logits).dtype == torch.float32


def test_log_probs_bad_labels():
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
        log_probs_from_logits(torch.zeros(1, 2, 4), torch.tensor([[0, -100]]))
    with pytest.raises(ValueError, match="do not match"):
        log_probs_from_logits(torch.zeros(1, 2, 4), torch.tensor([[0, 1, 2]]))


# ----------------------------------------------------------------------------- package hygiene


def test_algorithms_import_only_torch():
    # docs/architecture.md: reasonrl.algorithms imports no torch.distributed, ray, transformers or model code.
    allowed_roots = {"torch", "typing", "math", "__future__"}
    for path in Path(algorithms.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                if name == "reasonrl.registry":  # the names -> implementations idiom; it imports nothing of reasonrl
                    continue
                assert name.split(".")[0] in allowed_roots, f"{path.name} imports {name}"
                assert not name.startswith("torch.distributed"), f"{path.name} imports {name}"
