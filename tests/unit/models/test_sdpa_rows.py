"""sdpa without empty query rows (reasonrl/models/sdpa_rows.py): the masks by hand, and a left-padded model whose real
tokens compute exactly what they did (log-probs and gradients against eager attention). The NaN itself needs the
H200's cuDNN attention backend (benchmarks/results/gpu_nan_probe.json); the CPU's kernels give finite gradients on
empty rows, so here the test holds the fix's contract: no empty row reaches the kernel, nothing else changes."""
import torch

from reasonrl.models.sdpa_rows import register_sdpa_without_empty_rows, unmask_empty_rows


def left_padded_causal(pads, length):
    """[rows, 1, L, L] bool: causal and key-padding (the first ``pad`` positions of a row are padding)."""
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    rows = []
    for pad in pads:
        keys = torch.arange(length) >= pad
        rows.append(causal & keys[None, :])
    return torch.stack(rows)[:, None]


def test_an_empty_row_gets_its_own_position_and_nothing_else_changes():
    mask = left_padded_causal([2, 0], 4)
    fixed = unmask_empty_rows(mask)
    # Row 0, pad 2: queries 0 and 1 see no key (keys 0, 1 are padding); each now sees itself, only itself.
    assert fixed[0, 0].tolist() == [[True, False, False, False],
                                    [False, True, False, False],
                                    [False, False, True, False],
                                    [False, False, True, True]]
    assert torch.equal(fixed[1], mask[1])  # row 1 has no padding: untouched


def test_no_empty_row_returns_the_same_mask_and_additive_masks_are_handled():
    mask = left_padded_causal([0, 0], 3)
    assert unmask_empty_rows(mask) is mask
    assert unmask_empty_rows(None) is None
    additive = torch.zeros(1, 1, 3, 3).masked_fill(~left_padded_causal([1], 3), float("-inf"))
    fixed = unmask_empty_rows(additive)
    assert fixed[0, 0, 0].tolist() == [0.0, float("-inf"), float("-inf")]  # query 0 now sees key 0
    assert torch.equal(fixed[0, 0, 1:], additive[0, 0, 1:])


def test_a_decoding_step_maps_queries_to_the_last_keys():
    # 1 query over 3 keys, all padding: the query is key position 2 (keys - queries = 2).
    mask = torch.zeros(1, 1, 1, 3, dtype=torch.bool)
    assert unmask_empty_rows(mask)[0, 0, 0].tolist() == [False, False, True]


def test_real_tokens_compute_what_eager_attention_computes():
    from transformers import LlamaConfig, LlamaForCausalLM

    register_sdpa_without_empty_rows()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    ids = torch.randint(1, 64, (2, 7))
    attention = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    position_ids = (attention.cumsum(-1) - 1).clamp_min(0)
    results = {}
    for impl in ("eager", "sdpa"):
        torch.manual_seed(1)
        model = LlamaForCausalLM(config)
        model.set_attn_implementation(impl)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=position_ids).logits
        log_probs = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        real = (attention[:, :-1] & attention[:, 1:]).bool()  # a real token predicting a real token
        (-(log_probs[real]).mean()).backward()
        results[impl] = (log_probs[real].detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    assert torch.allclose(results["sdpa"][0], results["eager"][0], atol=1e-5)
    for name, grad in results["eager"][1].items():
        assert torch.allclose(results["sdpa"][1][name], grad, atol=1e-6, rtol=1e-4), name
