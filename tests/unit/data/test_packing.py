"""Padding-free packing (``reasonrl.data.packing``): the layout by hand, then the real SmolLM2 model giving the same
log-probs, entropy, gradients and critic values from one packed row as from the padded rows."""
from __future__ import annotations

import pytest
import torch

from reasonrl.data.collate import collate_rollout
from reasonrl.data.packing import pack_rows, trimmed_columns
from reasonrl.models.forward import micro_batch_log_probs, response_log_probs

# Rows of different prompt and response lengths; row 2's response is empty (a row with nothing to score).
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [15]]
RESPONSES = [[20, 21], [22, 23, 24, 25], [], [26]]


def small_batch():
    return collate_rollout(PROMPTS, RESPONSES, [[0.0] * len(r) for r in RESPONSES], pad_id=0)


def test_pack_rows_layout_by_hand():
    b = small_batch()  # P = 5, T = 4
    packed = pack_rows(b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"].shape[1])
    # Row after row, valid tokens only: [5 6 7 20 21] [8 9 22 23 24 25] [10 11 12 13 14] [15 26].
    assert packed.input_ids.tolist() == [[5, 6, 7, 20, 21, 8, 9, 22, 23, 24, 25, 10, 11, 12, 13, 14, 15, 26]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 0, 1]]
    # Response token 20 sits at packed index 3, so index 2 predicts it; 22 at 7 -> 6; 26 at 17 -> 16.
    assert packed.predict_index.tolist() == [2, 3, 6, 7, 8, 9, 16]
    assert packed.labels.tolist() == [20, 21, 22, 23, 24, 25, 26]
    assert list(zip(packed.rows.tolist(), packed.columns.tolist())) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2),
                                                                        (1, 3), (3, 0)]
    out = packed.unpack(torch.arange(1.0, 8.0))
    assert out.tolist() == [[1, 2, 0, 0], [3, 4, 5, 6], [0, 0, 0, 0], [7, 0, 0, 0]]


def test_pack_rows_rejects_a_response_without_a_prompt():
    ids = torch.tensor([[0, 3, 4]])
    attention = torch.tensor([[0, 1, 1]])
    with pytest.raises(ValueError, match="empty prompt"):
        pack_rows(ids, attention, (attention.cumsum(-1) - 1).clamp(min=0), 2)


def test_trimmed_columns_by_hand():
    b = small_batch()
    # Column 0 holds row 2's first prompt token (5 long): nothing to trim on the left; the longest response is 4.
    assert trimmed_columns(b["attention_mask"], 4) == (0, 4)
    # Without rows 1 and 2: prompts of 3 and 1 tokens start at column 2; responses of 2 and 1 tokens keep 2 columns.
    sub = b.select([0, 3])
    assert trimmed_columns(sub["attention_mask"], 4) == (2, 2)


# ----------------------------------------------------------------------------- the real model


def rollout_batch(tokenizer):
    prompts = ["What is 12 times 7?", "Hi", "Name three prime numbers greater than ten, please."]
    responses = ["12 times 7 is 84.", "Hello! How can I help you today?", "11, 13 and 17."]
    p_ids = [tokenizer(p)["input_ids"] for p in prompts]
    r_ids = [tokenizer(r)["input_ids"] for r in responses]
    return collate_rollout(p_ids, r_ids, [[0.0] * len(r) for r in r_ids], tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def smollm2(model_path):
    from reasonrl.models import load_causal_lm, load_tokenizer

    return load_causal_lm(model_path, torch.float32).eval(), load_tokenizer(model_path)


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False])
def test_packed_log_probs_and_entropy_equal_the_padded_path(smollm2, fused):
    model, tokenizer = smollm2
    b = rollout_batch(tokenizer)
    mask = b["response_mask"].bool()
    args = (b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"])
    with torch.no_grad():
        ref_lp, ref_ent = response_log_probs(model, *args, with_entropy=True, fused=fused)
        for packed in (True, False):  # packed, and padded with all-padding columns trimmed
            lp, ent = micro_batch_log_probs(model, *args, with_entropy=True, packed=packed, fused=fused)
            torch.testing.assert_close(lp[mask], ref_lp[mask], atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(ent[mask], ref_ent[mask], atol=2e-5, rtol=1e-5)
            assert torch.all(lp[~mask] == 0) and torch.all(ent[~mask] == 0)
    assert ref_lp[mask].max() < 0 and ref_ent[mask].min() > 0  # real numbers, not zeros that would trivially match


@pytest.mark.slow
def test_packed_gradient_equals_the_padded_gradient(smollm2):
    model, tokenizer = smollm2
    b = rollout_batch(tokenizer)
    mask = b["response_mask"]
    weights = torch.linspace(-1.0, 1.0, mask.numel()).view(mask.shape)  # an arbitrary per-token loss weighting
    args = (b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"])
    grads = []
    for packed in (None, True):  # None: the original padded call
        model.zero_grad(set_to_none=True)
        if packed is None:
            lp, ent = response_log_probs(model, *args, with_entropy=True)
        else:
            lp, ent = micro_batch_log_probs(model, *args, with_entropy=True, packed=True)
        ((lp + 0.1 * ent) * weights * mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    model.zero_grad(set_to_none=True)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 100
    for name, padded in grads[0].items():
        # fp32 sums over the tokens in another order: equal to ~3e-5 of each tensor's largest entry (measured).
        scale = padded.abs().max()
        assert (grads[1][name] - padded).abs().max() <= 1e-4 * scale, name


@pytest.mark.slow
def test_packed_critic_values_equal_the_padded_values(model_path):
    from reasonrl.models import load_tokenizer
    from reasonrl.models.value_head import ValueModel, micro_batch_values, response_values

    model = ValueModel.from_pretrained(model_path).eval()
    torch.nn.init.normal_(model.value_head.weight, std=0.05, generator=torch.Generator().manual_seed(0))
    b = rollout_batch(load_tokenizer(model_path))
    mask = b["response_mask"].bool()
    args = (model, b["input_ids"], b["attention_mask"], b["position_ids"])
    with torch.no_grad():
        ref = response_values(*args, b["responses"].shape[1])
        for packed in (True, False):
            values = micro_batch_values(*args, b["responses"].shape[1], packed=packed)
            torch.testing.assert_close(values[mask], ref[mask], atol=2e-5, rtol=1e-5)
            assert torch.all(values[~mask] == 0)
    assert ref[mask].abs().min() > 0  # a non-zero head: the comparison means something
