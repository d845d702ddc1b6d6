"""``model.attn_implementation=varlen`` (reasonrl/models/varlen_attention.py): sequence boundaries from packed position
ids by hand; on the CPU the registered attention (its per-sequence sdpa fallback) gives a packed row the log-probs,
gradients and critic values each sequence gets alone; the one call of torch's kernel against the signatures of torch
2.11 and 2.13; ``auto`` resolved per device."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import padded_rollout_batch, tiny_sharp_lm

from reasonrl.config import load_config
from reasonrl.config.device_defaults import (VARLEN_ATTENTION, attn_implementation_for, device_settings,
                                             use_packing_for)
from reasonrl.config.plan import RunPlan
from reasonrl.data.packing import pack_rows
from reasonrl.models import varlen_attention
from reasonrl.models.forward import micro_batch_log_probs, response_log_probs
from reasonrl.models.varlen_attention import (cu_seqlens_from_position_ids, prepared_attention,
                                              register_varlen_attention, varlen_mask)

# ----------------------------------------------------------------------------- boundaries by hand


def test_cu_seqlens_from_packed_position_ids_by_hand():
    cu, longest = cu_seqlens_from_position_ids(torch.tensor([[0, 1, 2, 0, 0, 1, 2, 3]]))  # lengths 3, 1, 4
    assert cu.tolist() == [0, 3, 4, 8] and cu.dtype == torch.int32 and longest == 4
    # Two rows: each row's first token starts a sequence, even when the last row ended mid-count.
    cu, longest = cu_seqlens_from_position_ids(torch.tensor([[0, 1, 0, 1, 2], [2, 3, 4, 5, 6]]))
    assert cu.tolist() == [0, 2, 5, 10] and longest == 5
    # A row that does not start at 0 is one sequence; a jump or a restart starts the next.
    cu, longest = cu_seqlens_from_position_ids(torch.tensor([[7, 8, 9, 3, 4, 0]]))
    assert cu.tolist() == [0, 3, 5, 6] and longest == 3


def test_the_packing_of_collated_rows_gives_their_boundaries():
    ids, attention, positions, responses, _ = padded_rollout_batch()  # rows of 5 + 4, 2 + 3 and 3 + 1 tokens
    packed = pack_rows(ids, attention, positions, responses.shape[1])
    cu, longest = cu_seqlens_from_position_ids(packed.position_ids)
    assert cu.tolist() == [0, 9, 14, 18] and longest == 9


# ----------------------------------------------------------------------------- the registered attention on the CPU


def _varlen_copy(model):
    """A copy of ``model`` (same weights) that attends through the registered varlen implementation."""
    register_varlen_attention()
    out = copy.deepcopy(model)
    out.set_attn_implementation(VARLEN_ATTENTION)
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_packed_row_gets_each_sequence_s_own_log_probs_and_gradients(kind):
    sdpa = tiny_sharp_lm(kind)  # 4 query heads, 2 KV heads: grouped-query attention
    assert sdpa.config.num_attention_heads != sdpa.config.num_key_value_heads
    varlen = _varlen_copy(sdpa)
    assert varlen.config._attn_implementation == VARLEN_ATTENTION
    ids, attention, positions, responses, response_mask = padded_rollout_batch()
    packed_lp, _ = micro_batch_log_probs(varlen, ids, attention, positions, responses, packed=True)
    (packed_lp * response_mask).sum().backward()
    width = responses.shape[1]
    for row in range(ids.shape[0]):  # each sequence alone: no padding, no neighbour, sdpa
        valid = attention[row].bool()
        n = int(response_mask[row].sum())
        alone_lp, _ = response_log_probs(sdpa, ids[row][valid][None], None, positions[row][valid][None],
                                         responses[row, :n][None])
        torch.testing.assert_close(packed_lp[row, :n], alone_lp[0], atol=1e-5, rtol=0)
        assert (packed_lp[row, n:width] == 0).all()
        alone_lp.sum().backward()
    for (name, a), b in zip(sdpa.named_parameters(), varlen.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_padded_rows_under_varlen_take_sdpa_s_masked_path():
    sdpa = tiny_sharp_lm("llama")
    varlen = _varlen_copy(sdpa)
    ids, attention, positions, responses, _ = padded_rollout_batch()
    with torch.no_grad():
        got, _ = micro_batch_log_probs(varlen, ids, attention, positions, responses, packed=False)
        want, _ = micro_batch_log_probs(sdpa, ids, attention, positions, responses, packed=False)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_the_mask_is_left_to_the_attention_only_without_padding():
    assert varlen_mask(1, 8, 8, attention_mask=None) is None
    padding = torch.tensor([[False, True, True], [True, True, True]])
    mask = varlen_mask(2, 3, 3, attention_mask=padding)
    assert mask.shape == (2, 1, 3, 3) and not mask[0, 0, :, 0].any()


def test_critic_values_of_a_packed_row_match_each_sequence_alone(tmp_path):
    from reasonrl.models.value_head import ValueModel

    tiny_sharp_lm("qwen2", tied=False).save_pretrained(str(tmp_path), safe_serialization=True)
    sdpa = ValueModel.from_pretrained(str(tmp_path), attn="sdpa").eval()
    varlen = ValueModel.from_pretrained(str(tmp_path), attn=VARLEN_ATTENTION).eval()
    assert varlen.config._attn_implementation == VARLEN_ATTENTION
    torch.manual_seed(3)
    with torch.no_grad():
        for head in (sdpa.value_head, varlen.value_head):
            head.weight.copy_(torch.linspace(-1, 1, head.weight.numel()).view_as(head.weight))
        lengths = [4, 1, 6]
        ids = torch.randint(1, 90, (1, sum(lengths)))
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
        packed = varlen(ids, None, positions)[0]
        start = 0
        for n in lengths:
            alone = sdpa(ids[:, start:start + n], None, positions[:, start:start + n])[0]
            torch.testing.assert_close(packed[start:start + n], alone, atol=1e-5, rtol=0)
            start += n


def test_sliding_window_layers_are_refused_naming_the_setting():
    from transformers import MistralConfig, MistralForCausalLM

    register_varlen_attention()
    model = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, sliding_window=4))
    model.set_attn_implementation(VARLEN_ATTENTION)
    with pytest.raises(NotImplementedError, match="model.attn_implementation=sdpa"):
        model(input_ids=torch.tensor([[1, 2, 3, 4, 5, 6]]), position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]]))


# ----------------------------------------------------------------------------- the kernel's call, 2.11 and 2.13


def _by_hand(q, k, v, bounds, scale):
    """Causal softmax attention of each sequence, written out: q [N, Hq, D], k/v [N, Hkv, D]."""
    groups = q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    for s, e in zip(bounds[:-1], bounds[1:]):
        for h in range(q.shape[1]):
            scores = q[s:e, h] @ k[s:e, h // groups].T * scale
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -math.inf)
            out[s:e, h] = scores.softmax(-1) @ v[s:e, h // groups]
    return out


def _kernel_standin(calls, gqa: bool):
    """A stand-in for ``varlen_attn`` (the CPU has no kernel) with torch 2.13's signature (``enable_gqa``) or 2.11's
    (none): it records its arguments and computes what the kernel computes for them."""
    def attention(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                  window_size=(-1, -1), **extra):
        calls.append(dict(heads=(query.shape[1], key.shape[1]), window_size=tuple(window_size), scale=scale,
                          max=(max_q, max_k), **extra))
        assert window_size == (-1, 0) and cu_seq_q is cu_seq_k
        return _by_hand(query, key, value, cu_seq_q.tolist(), scale)

    if gqa:
        def with_gqa(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                     window_size=(-1, -1), enable_gqa=False):
            return attention(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                             window_size=window_size, enable_gqa=enable_gqa)
        return with_gqa
    return attention


@pytest.mark.parametrize("gqa", [True, False], ids=["torch-2.13", "torch-2.11"])
def test_the_kernel_call_adapts_to_the_signature(monkeypatch, gqa):
    import torch.nn.attention.varlen as varlen_module

    calls = []
    monkeypatch.setattr(varlen_module, "varlen_attn", _kernel_standin(calls, gqa))
    varlen_attention._varlen_parameters.cache_clear()
    try:
        torch.manual_seed(0)
        q, k, v = torch.randn(8, 4, 8), torch.randn(8, 2, 8), torch.randn(8, 2, 8)
        cu = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
        out = varlen_attention._varlen_causal(q, k, v, cu, 4, scale=0.25)
    finally:
        varlen_attention._varlen_parameters.cache_clear()
    torch.testing.assert_close(out, _by_hand(q, k, v, [0, 3, 4, 8], 0.25), atol=1e-6, rtol=0)
    (call,) = calls
    assert call["max"] == (4, 4) and call["scale"] == 0.25
    if gqa:
        assert call["heads"] == (4, 2) and call["enable_gqa"] is True
    else:
        assert call["heads"] == (4, 4) and "enable_gqa" not in call  # KV heads repeated


def test_the_fallback_is_per_sequence_causal_attention():
    torch.manual_seed(1)
    q, k, v = torch.randn(8, 4, 8), torch.randn(8, 2, 8), torch.randn(8, 2, 8)
    got = varlen_attention._per_sequence_sdpa(q, k, v, torch.tensor([0, 3, 4, 8]), None)
    torch.testing.assert_close(got, _by_hand(q, k, v, [0, 3, 4, 8], 1 / math.sqrt(8)), atol=1e-6, rtol=0)
    assert not varlen_attention.uses_kernel(q)  # a CPU tensor never goes to the kernel


# ----------------------------------------------------------------------------- auto, per device


def test_auto_resolves_to_varlen_only_on_a_gpu_whose_torch_has_the_kernel():
    assert attn_implementation_for("auto", "cuda", varlen_importable=True) == VARLEN_ATTENTION
    assert attn_implementation_for("auto", "cuda:3", varlen_importable=True) == VARLEN_ATTENTION
    assert attn_implementation_for("auto", "cuda", varlen_importable=False) == "sdpa"
    assert attn_implementation_for("auto", "cpu", varlen_importable=True) == "sdpa"
    assert attn_implementation_for("eager", "cuda", varlen_importable=True) == "eager"
    assert use_packing_for(None, VARLEN_ATTENTION) is True and use_packing_for(None, "flash_attention_2") is True
    assert use_packing_for(None, "sdpa") is False and use_packing_for(None, "flex_attention") is False
    assert use_packing_for(False, VARLEN_ATTENTION) is False and use_packing_for(True, "sdpa") is True


def test_the_defaults_are_auto_and_resolve_on_the_cpu():
    cfg, _ = load_config(["task=arith"], cuda_available=False)
    assert cfg.model.attn_implementation == "auto" and cfg.actor.use_packing is None
    rows = {s.key: s.value for s in device_settings(cfg, "cpu")}
    run = RunPlan.build(cfg).run_config(cfg)  # what the workers are handed; the loaded config keeps auto
    assert rows["model.attn_implementation"] == "sdpa" == run.model.attn_implementation
    assert rows["actor.use_packing"] is False is run.actor.use_packing
    assert cfg.model.attn_implementation == "auto" and cfg.actor.use_packing is None
    assert prepared_attention("auto", "cpu") == "sdpa"
    set_by_you, _ = load_config(["task=arith", "model.attn_implementation=varlen", "actor.use_packing=false"],
                                cuda_available=False)
    rows = {s.key: s.value for s in device_settings(set_by_you, "cpu")}
    assert rows["model.attn_implementation"] == VARLEN_ATTENTION and rows["actor.use_packing"] is False
