"""Chunked log-probs through the LM-head weight (``reasonrl.models.fused_logprob``) and the fused path of
``response_log_probs``: the same numbers and gradients as full logits, by hand and on tiny random Qwen2/Llama models
(tied and untied embeddings, padded rows, chunk sizes that do not divide the token count), under FSDP2 too, and
with the decoder layers compiled."""
from __future__ import annotations

import math

import pytest
import torch
from components import require

from reasonrl.models.forward import fused_lm_head, response_log_probs
from reasonrl.models.fused_logprob import linear_log_probs

from helpers import SHARP_LM_VOCAB, free_port, padded_rollout_batch, tiny_sharp_lm  # tests/ is on sys.path

VOCAB = SHARP_LM_VOCAB


def naive(hidden, weight, labels):
    """Full float32 logits, then log-softmax: the reference."""
    logp = torch.log_softmax((hidden @ weight.t()).float(), dim=-1)
    picked = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return picked, entropy


# ----------------------------------------------------------------------------- the autograd function, by hand


def test_two_token_vocabulary_by_hand():
    # W = [[0], [1]], h = ln 3 -> logits [0, ln 3] -> p = [1/4, 3/4].
    hidden = torch.tensor([[math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([[0.0], [1.0]], dtype=torch.float64, requires_grad=True)
    lp, ent = linear_log_probs(hidden, weight, torch.tensor([1]), chunk_size=1, with_entropy=True)
    assert lp.item() == pytest.approx(math.log(0.75))
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    lp.sum().backward()
    # d log p_1 / dz = onehot - p = [-1/4, 1/4]; dh = dz . W = 1/4; dW = dz^T h = [-ln3/4, ln3/4].
    assert hidden.grad.item() == pytest.approx(0.25)
    assert weight.grad[:, 0].tolist() == pytest.approx([-math.log(3.0) / 4, math.log(3.0) / 4])


def test_entropy_gradient_by_hand():
    # Same logits; H = ln(1 + e^h) - h e^h / (1 + e^h) with h the second logit (W = [[0], [1]]).
    # dH/dh = -h sigma(h) (1 - sigma(h)) = -ln3 * 3/4 * 1/4 = -3 ln3 / 16.
    hidden = torch.tensor([[math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    _, ent = linear_log_probs(hidden, weight, torch.tensor([0]), with_entropy=True)
    ent.sum().backward()
    assert hidden.grad.item() == pytest.approx(-3 * math.log(3.0) / 16)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 10, 64])
def test_matches_full_logits_values_and_gradients(chunk_size):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 16, generator=g, requires_grad=True)   # 10 tokens: 3 and 7 do not divide them
    weight = torch.randn(VOCAB, 16, generator=g, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, 5), generator=g)
    w_lp, w_ent = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)  # an arbitrary loss of both

    lp, ent = linear_log_probs(hidden, weight, labels, chunk_size=chunk_size, with_entropy=True)
    ref_lp, ref_ent = naive(hidden, weight, labels)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)

    got = torch.autograd.grad((w_lp * lp + w_ent * ent).sum(), (hidden, weight))
    want = torch.autograd.grad((w_lp * ref_lp + w_ent * ref_ent).sum(), (hidden, weight))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_only_log_probs_and_no_grad():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(7, 8, generator=g, requires_grad=True)
    weight = torch.randn(VOCAB, 8, generator=g)
    labels = torch.randint(0, VOCAB, (7,), generator=g)
    lp, ent = linear_log_probs(hidden, weight, labels, chunk_size=4)
    assert ent is None
    (grad,) = torch.autograd.grad(lp.sum(), hidden)
    (want,) = torch.autograd.grad(naive(hidden, weight, labels)[0].sum(), hidden)
    torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        lp2, ent2 = linear_log_probs(hidden, weight, labels, chunk_size=4, with_entropy=True)
    assert not lp2.requires_grad and ent2 is not None
    torch.testing.assert_close(ent2, naive(hidden, weight, labels)[1], rtol=1e-5, atol=1e-5)


def test_rejects_labels_outside_the_vocabulary():
    with pytest.raises(ValueError, match="labels must lie"):
        linear_log_probs(torch.zeros(2, 4), torch.zeros(VOCAB, 4), torch.tensor([0, VOCAB]))


# ----------------------------------------------------------------------------- whole models


def grads_of(model, fused: bool, chunk_size: int, with_entropy: bool):
    ids, mask, pos, resp, rmask = padded_rollout_batch()
    model.zero_grad(set_to_none=True)
    lp, ent = response_log_probs(model, ids, mask, pos, resp, with_entropy=with_entropy, chunk_size=chunk_size,
                                 fused=fused)
    loss = (lp * rmask).sum() + (0.3 * (ent * rmask).sum() if with_entropy else 0.0)
    loss.backward()
    return lp.detach(), (ent.detach() if with_entropy else None), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind,tied", [("qwen2", True), ("qwen2", False), ("llama", True)])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_model_fused_equals_full_logits(kind, tied, with_entropy):
    model = tiny_sharp_lm(kind, tied)
    assert fused_lm_head(model) is model.lm_head
    lp0, ent0, g0 = grads_of(model, fused=False, chunk_size=2048, with_entropy=with_entropy)
    lp1, ent1, g1 = grads_of(model, fused=True, chunk_size=5, with_entropy=with_entropy)  # 12 tokens, chunks of 5
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-5)
    if with_entropy:
        torch.testing.assert_close(ent1, ent0, rtol=1e-5, atol=1e-5)
    assert g0.keys() == g1.keys()
    assert ("lm_head.weight" in g1) != tied  # tied: the head's gradient lands on the embedding
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-5, msg=name)
    assert model.lm_head.forward.__func__ is type(model.lm_head).forward  # the head's own forward is back


def test_no_grad_entropy_pass_and_the_head_restored_on_error():
    model = tiny_sharp_lm("qwen2", True)
    ids, mask, pos, resp, _ = padded_rollout_batch()
    with torch.no_grad():
        lp0, ent0 = response_log_probs(model, ids, mask, pos, resp, with_entropy=True, fused=False)
        lp1, ent1 = response_log_probs(model, ids, mask, pos, resp, with_entropy=True, fused=True)
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent1, ent0, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        response_log_probs(model, ids, mask, pos, resp + VOCAB, fused=True)
    assert "forward" not in vars(model.lm_head)


def test_models_with_transformed_logits_take_the_full_logits_path():
    model = tiny_sharp_lm("llama", True)
    model.config.final_logit_softcapping = 30.0  # as Gemma 2 would: log-probs of the raw head would be wrong
    assert fused_lm_head(model) is None
    ids, mask, pos, resp, _ = padded_rollout_batch()
    lp, _ = response_log_probs(model, ids, mask, pos, resp, fused=True)
    assert lp.shape == resp.shape


# ----------------------------------------------------------------------------- FSDP2 and torch.compile


def test_fsdp2_sharded_tied_model_gets_the_same_gradients():
    """The head's weight is an FSDP2-managed parameter tied to the embedding: the fused path's gradient must reach
    the sharded parameter through FSDP's reduce-scatter (world size 1, gloo)."""
    from reasonrl.workers.distributed import init_distributed
    from reasonrl.workers.fsdp import shard_model

    mesh = init_distributed(0, 1, "127.0.0.1", free_port(), "cpu")
    plain = tiny_sharp_lm("qwen2", True)
    _, _, want = grads_of(plain, fused=False, chunk_size=2048, with_entropy=True)
    sharded = tiny_sharp_lm("qwen2", True)
    shard_model(sharded, mesh, "cpu", torch.float32)
    assert fused_lm_head(sharded) is not None
    for _ in range(2):  # twice: the second call starts from the state FSDP left after the first backward
        _, _, got = grads_of(sharded, fused=True, chunk_size=5, with_entropy=True)
        assert got.keys() == want.keys()
        for name, grad in got.items():
            torch.testing.assert_close(grad.full_tensor(), want[name], rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_decoder_layers_give_the_same_log_probs():
    from torch._dynamo.utils import counters

    from reasonrl.workers.fsdp import compile_decoder_layers

    model = tiny_sharp_lm("qwen2", True)
    ids, mask, pos, resp, _ = padded_rollout_batch()
    with torch.no_grad():
        want, _ = response_log_probs(model, ids, mask, pos, resp)
    assert compile_decoder_layers(model) == 2
    torch._dynamo.reset()
    counters.clear()
    try:
        with torch.no_grad():
            got, _ = response_log_probs(model, ids, mask, pos, resp)
    except Exception as exc:  # noqa: BLE001 - inductor needs a working C++ toolchain
        if type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
            require("torch.compile (inductor, with a C++ compiler)", False, f"{exc!r}"[:300])
        raise
    assert counters["stats"]["unique_graphs"] >= 1  # the layers really ran compiled
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_bfloat16_model_matches_within_bfloat16_noise():
    """bf16 compute (as on the GPU): the fused path's log-probs and gradients agree with full logits up to bf16
    rounding (the gradients' dtypes match the parameters')."""
    model = tiny_sharp_lm("qwen2", True).to(torch.bfloat16)
    lp0, ent0, g0 = grads_of(model, fused=False, chunk_size=2048, with_entropy=True)
    lp1, ent1, g1 = grads_of(model, fused=True, chunk_size=5, with_entropy=True)
    assert lp1.dtype == torch.float32
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-3)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-3)
    for name in g0:
        assert g1[name].dtype == torch.bfloat16
        cosine = torch.nn.functional.cosine_similarity(g1[name].float().flatten(), g0[name].float().flatten(), dim=0)
        assert cosine > 0.999, (name, cosine)
