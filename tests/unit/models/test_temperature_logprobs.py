"""Training-side log-probs at the sampling temperature: every path of ``reasonrl.models.forward`` (fused, full
logits, packed, padded) gives log_softmax(logits / T) and its entropy, by hand and on a tiny random model, with the
fused path's hand-written backward scaled by 1/T; greedy rollouts (T = 0) are scored at 1; the worker's log-prob
path takes ``rollout.temperature``; the hf engine reports its sampled tokens' log-probs at the sampling temperature.
"""
from __future__ import annotations

import math

import pytest
import torch

from reasonrl.models.forward import (micro_batch_log_probs, packed_response_log_probs, response_log_probs,
                                     training_temperature)
from reasonrl.models.fused_logprob import linear_log_probs

from helpers import SHARP_LM_VOCAB, padded_rollout_batch, tiny_sharp_lm  # tests/ is on sys.path

VOCAB = SHARP_LM_VOCAB
LN2 = math.log(2.0)


# ----------------------------------------------------------------------------- by hand


def test_fused_log_prob_entropy_and_gradient_at_half_temperature_by_hand():
    # W = [[0], [1], [2]], h = ln 2 -> z = [0, ln2, 2 ln2]; at T = 1/2, z/T = [0, 2 ln2, 4 ln2] = ln [1, 4, 16],
    # so p = [1, 4, 16] / 21 (at T = 1 it would be [1, 2, 4] / 7).
    hidden = torch.tensor([[LN2]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64, requires_grad=True)
    lp, ent = linear_log_probs(hidden, weight, torch.tensor([2]), chunk_size=1, with_entropy=True, temperature=0.5)
    p = [1 / 21, 4 / 21, 16 / 21]
    assert lp.item() == pytest.approx(math.log(16 / 21))
    assert ent.item() == pytest.approx(-sum(q * math.log(q) for q in p))
    lp.sum().backward()
    # d log p_2 / dz_j = ([j = 2] - p_j) / T = [-1/21, -4/21, 5/21] * 2; dW_j = that * h (= ln 2);
    # dh = sum_j (dz_j) W_j = 2 * (-4/21 + 2 * 5/21) = 12/21.
    assert weight.grad[:, 0].tolist() == pytest.approx([-2 / 21 * LN2, -8 / 21 * LN2, 10 / 21 * LN2])
    assert hidden.grad.item() == pytest.approx(12 / 21)
    lp1, _ = linear_log_probs(hidden.detach(), weight.detach(), torch.tensor([2]))
    assert lp1.item() == pytest.approx(math.log(4 / 7))  # the default is T = 1


def test_fused_entropy_gradient_at_temperature_equals_autograd():
    """The entropy branch of the hand-written backward at T = 0.7 against autograd through log_softmax(z / T)."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(VOCAB, 8, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, VOCAB, (7,), generator=g)
    w_lp, w_ent = torch.randn(7, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)
    lp, ent = linear_log_probs(hidden, weight, labels, chunk_size=3, with_entropy=True, temperature=0.7)
    grads = torch.autograd.grad((lp * w_lp + ent * w_ent).sum(), (hidden, weight))
    logp = torch.log_softmax(hidden @ weight.t() / 0.7, dim=-1)
    want_lp, want_ent = logp.gather(-1, labels[:, None])[:, 0], -(logp.exp() * logp).sum(-1)
    want = torch.autograd.grad((want_lp * w_lp + want_ent * w_ent).sum(), (hidden, weight))
    # the function's outputs and its softmax maths are float32, whatever the inputs' dtype
    torch.testing.assert_close(lp.double(), want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), want_ent, rtol=1e-5, atol=1e-5)
    for got, expected in zip(grads, want):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_greedy_is_scored_at_one_and_bad_temperatures_are_refused():
    assert training_temperature(0.0) == 1.0 and training_temperature(-1.0) == 1.0
    assert training_temperature(0.7) == 0.7 and training_temperature(1.0) == 1.0
    with pytest.raises(ValueError, match="temperature"):
        linear_log_probs(torch.zeros(1, 1), torch.zeros(3, 1), torch.tensor([0]), temperature=0.0)
    model = tiny_sharp_lm()
    ids, mask, pos, resp, _ = padded_rollout_batch()
    for bad in (0.0, -0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            response_log_probs(model, ids, mask, pos, resp, temperature=bad)


# ----------------------------------------------------------------------------- a tiny model, every path


def reference_at(model, temperature):
    """log_softmax(logits / T) of the response tokens and its entropy, straight from the model's full logits."""
    ids, mask, pos, resp, _ = padded_rollout_batch()
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -resp.shape[1] - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, resp[..., None])[..., 0], -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("fused", [True, False])
def test_every_path_gives_log_softmax_of_logits_over_t(fused):
    model = tiny_sharp_lm()
    ids, mask, pos, resp, rmask = padded_rollout_batch()
    valid = rmask.bool()
    with torch.no_grad():
        want_lp, want_ent = reference_at(model, 0.7)
        one_lp, _ = reference_at(model, 1.0)
        lp, ent = response_log_probs(model, ids, mask, pos, resp, with_entropy=True, chunk_size=5, fused=fused,
                                     temperature=0.7)
        torch.testing.assert_close(lp[valid], want_lp[valid], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent[valid], want_ent[valid], rtol=1e-5, atol=1e-5)
        for packed in (True, False):  # packed into one row, and padded with the all-padding columns trimmed
            lp, ent = micro_batch_log_probs(model, ids, mask, pos, resp, with_entropy=True, packed=packed,
                                            chunk_size=5, fused=fused, temperature=0.7)
            torch.testing.assert_close(lp[valid], want_lp[valid], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ent[valid], want_ent[valid], rtol=1e-5, atol=1e-5)
            assert torch.all(lp[~valid] == 0) and torch.all(ent[~valid] == 0)
    # the temperature matters on this model: at T = 1 the log-probs are far from those at 0.7
    assert (one_lp[valid] - want_lp[valid]).abs().max() > 0.1


def test_packed_rows_at_temperature_equal_the_padded_rows():
    from reasonrl.data.packing import pack_rows

    model = tiny_sharp_lm()
    ids, mask, pos, resp, rmask = padded_rollout_batch()
    with torch.no_grad():
        want, _ = response_log_probs(model, ids, mask, pos, resp, temperature=1.3, fused=False)
        got, _ = packed_response_log_probs(model, pack_rows(ids, mask, pos, resp.shape[1]), temperature=1.3)
    torch.testing.assert_close(got[rmask.bool()], want[rmask.bool()], rtol=1e-5, atol=1e-5)


def test_fused_gradients_at_temperature_equal_the_full_logits_gradients():
    model = tiny_sharp_lm()
    ids, mask, pos, resp, rmask = padded_rollout_batch()
    grads = []
    for fused in (False, True):
        model.zero_grad(set_to_none=True)
        lp, ent = response_log_probs(model, ids, mask, pos, resp, with_entropy=True, chunk_size=5, fused=fused,
                                     temperature=0.7)
        ((lp + 0.3 * ent) * rmask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5, msg=name)


def test_bfloat16_fused_and_full_logits_agree_at_temperature():
    """bf16 compute (as on the GPU): at T = 0.7 the fused path (float32 division inside each chunk, forward and
    backward) matches the full-logits path (bf16 logits, divided in float32) up to bf16 rounding, as at T = 1
    (tests/unit/models/test_fused_logprob.py, same tolerances)."""
    model = tiny_sharp_lm().to(torch.bfloat16)
    ids, mask, pos, resp, rmask = padded_rollout_batch()
    out = []
    for fused in (False, True):
        model.zero_grad(set_to_none=True)
        lp, ent = response_log_probs(model, ids, mask, pos, resp, with_entropy=True, chunk_size=5, fused=fused,
                                     temperature=0.7)
        ((lp + 0.3 * ent) * rmask).sum().backward()
        out.append((lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                if p.grad is not None}))
    (lp0, ent0, g0), (lp1, ent1, g1) = out
    assert lp1.dtype == torch.float32
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-3)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-3)
    for name in g0:
        cosine = torch.nn.functional.cosine_similarity(g1[name].float().flatten(), g0[name].float().flatten(), dim=0)
        assert cosine > 0.999, (name, cosine)


# ----------------------------------------------------------------------------- the worker and the hf engine


def test_worker_log_prob_path_uses_the_rollout_temperature():
    """``policy.mb_log_probs`` (every teacher-forced pass of the worker: old, actor and reference log-probs) scores at
    ``rollout.temperature``, and at 1 for greedy rollouts. It reads only ``cfg``, so no process group or engine
    starts."""
    from reasonrl.config import load_config
    from reasonrl.data.batch import Batch
    from reasonrl.workers.policy import mb_log_probs

    model = tiny_sharp_lm()
    ids, mask, pos, resp, rmask = padded_rollout_batch()
    mb = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": resp})
    valid = rmask.bool()
    with torch.no_grad():
        for rollout_t, scored_t in ((0.7, 0.7), (0.0, 1.0)):
            cfg = load_config([f"rollout.temperature={rollout_t}"], cuda_available=False)[0]
            lp, ent = mb_log_probs(cfg, model, mb, True)
            want_lp, want_ent = reference_at(model, scored_t)
            torch.testing.assert_close(lp[valid], want_lp[valid], rtol=1e-5, atol=1e-5)
            # float32 noise of lse - E_p[z] against -sum p log p, at T = 1 where some entropies are ~0.006
            torch.testing.assert_close(ent[valid], want_ent[valid], rtol=1e-5, atol=5e-5)
        assert (lp[valid] - reference_at(model, 0.7)[0][valid]).abs().max() > 0.1  # T = 1 was not 0.7


def test_hf_engine_reports_log_probs_at_the_sampling_temperature(model_path):
    """The hf engine's sampled-token log-probs are log_softmax(logits / T) of the tokens it sampled, the same
    numbers the trainer computes for them (greedy: T = 1)."""
    from reasonrl.models import load_tokenizer
    from reasonrl.rollout import SamplingParams
    from reasonrl.rollout.hf_engine import HFRolloutEngine

    model = tiny_sharp_lm()
    engine = HFRolloutEngine(model, load_tokenizer(model_path))
    prompt = [5, 9, 17]
    for temperature, scored in ((0.7, 0.7), (0.0, 1.0)):
        torch.manual_seed(0)
        sample = engine.generate([prompt], SamplingParams(n=1, temperature=temperature, max_new_tokens=6,
                                                          ignore_eos=True))[0][0]
        ids = torch.tensor([prompt + sample.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
        want = torch.log_softmax(logits / scored, dim=-1).gather(-1, ids[0, len(prompt):, None])[:, 0]
        assert len(sample.logprobs) == 6
        torch.testing.assert_close(torch.tensor(sample.logprobs), want, rtol=1e-5, atol=1e-5)
