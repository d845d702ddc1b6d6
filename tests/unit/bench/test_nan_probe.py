"""The NaN probe's parts (reasonrl/bench/nan_trace.py, nan_worker.py): naming the operation whose backward made the
first non-finite gradient, the masks attention was handed, and catching the first bad micro-batch of an update."""
import torch
from torch import nn

from reasonrl.bench.nan_trace import (LOSS, GradTrace, compared, fully_masked_rows, inject_nan_grad, localize,
                                      masked_row_sdpa_grads, padding_facts)
from reasonrl.bench.nan_worker import NonFiniteGradCatcher, grads_finite
from reasonrl.data.batch import Batch
from reasonrl.data.collate import collate_rollout


class SqrtAbs(nn.Module):
    """sqrt(|x|): finite forward at 0, but d/dx = sign(x) / (2 sqrt(|x|)) = 0 * inf there: NaN in the backward."""

    def forward(self, x):
        return x.abs().sqrt()


def _toy():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), SqrtAbs(), nn.Linear(4, 1))
    with torch.no_grad():  # the first layer outputs exactly 0, where SqrtAbs's backward divides by zero
        model[0].weight.zero_()
        model[0].bias.zero_()
    return model


def test_localize_names_the_op_whose_backward_makes_the_nan():
    model = _toy()
    with GradTrace(model, attention=False) as trace:
        out = model(torch.ones(2, 4))
        out.sum().backward()
    records = trace.records
    assert all(r["finite"] for r in records if r["phase"] == "forward")  # the forward is clean
    assert not torch.isfinite(model[0].weight.grad).all()
    found = localize(records)
    assert found["culprit"] == "1"  # SqrtAbs: its output gradient is finite (the last Linear's weights), its input's not
    assert "2" not in found["candidates"] and "0" not in found["candidates"]
    # the first non-finite gradient is that of the tensor between the first Linear and SqrtAbs (first seen through the
    # Linear's output hook, registered before SqrtAbs's input hook on the same tensor)
    first = found["first_nonfinite_grad"]
    assert (first["module"], first["what"]) == ("0", "output[0]")
    # the hooks are gone afterwards
    assert not model[1]._forward_hooks and not model[1]._forward_pre_hooks


def test_localize_blames_the_loss_when_the_gradient_arrives_non_finite():
    model = nn.Linear(4, 1)
    with GradTrace(model, attention=False) as trace:
        out = model(torch.ones(2, 4))
        (out - out).sqrt().sum().backward()  # d sqrt(0) = inf, times the 0 of (out - out)'s backward: NaN
    assert localize(trace.records)["culprit"] == LOSS


def test_localize_with_finite_gradients_names_nothing():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    with GradTrace(model, attention=False) as trace:
        model(torch.ones(2, 4)).sum().backward()
    assert localize(trace.records)["culprit"] is None


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg)


def test_injected_nan_is_named_and_the_attention_mask_is_read():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = _tiny_llama()
    # prompts of 3 and 1 tokens: the second row is left-padded by 2, and with causal attention its first 2 query
    # positions see no key at all
    batch = collate_rollout([[5, 6, 7], [8]], [[9, 10], [11, 12]], [[0.0] * 2] * 2, pad_id=0)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    clean = model(**inputs).logits.detach()
    inject_nan_grad(model.get_submodule("model.layers.1.mlp.down_proj"))
    with GradTrace(model) as trace:
        logits = model(**inputs).logits
        logits.log_softmax(-1)[:, -2:].sum().backward()
    assert torch.equal(logits.detach(), clean)  # the injection leaves the forward alone
    found = localize(trace.records)
    assert found["culprit"] == "model.layers.1.mlp.down_proj"
    masks = trace.masks
    assert [m["module"] for m in masks] == ["model.layers.0.self_attn.attention_fn",
                                            "model.layers.1.self_attn.attention_fn"]
    assert masks[0]["mask_shape"] == [2, 1, 5, 5] and masks[0]["fully_masked_query_rows"] == 2
    assert masks[0]["rows_with_fully_masked_queries"] == 1 and masks[0]["fully_masked_per_row"] == [0, 2]
    assert "sdpa" not in ALL_ATTENTION_FUNCTIONS._local_mapping  # the wrapper is removed afterwards
    assert padding_facts(batch["attention_mask"])["left_pad_per_row"] == [0, 2]


def test_attention_function_nan_is_named_and_located():
    """A NaN made inside the attention function (not a module), at the query positions with no key to attend to, is
    blamed on ``<layer>.self_attn.attention_fn`` and located at those positions."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = _tiny_llama()
    inner = ALL_ATTENTION_FUNCTIONS["sdpa"]

    class NanAtDeadQueries(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, dead):
            ctx.save_for_backward(dead)
            return q.view_as(q)

        @staticmethod
        def backward(ctx, g):
            (dead,) = ctx.saved_tensors  # [batch, q] -> [batch, 1, q, 1] over [batch, heads, q, head_dim]
            return g.masked_fill(dead[:, None, :, None], float("nan")), None

    def broken(module, q, k, v, mask, *args, **kwargs):  # layer 0's backward: NaN in its fully masked query rows
        if module.layer_idx == 0:
            q = NanAtDeadQueries.apply(q, ~mask.any(-1).squeeze(1))
        return inner(module, q, k, v, mask, *args, **kwargs)

    batch = collate_rollout([[5, 6, 7], [8]], [[9, 10], [11, 12]], [[0.0] * 2] * 2, pad_id=0)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = broken
    try:
        with GradTrace(model) as trace:
            model(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}).logits.sum().backward()
    finally:
        del ALL_ATTENTION_FUNCTIONS["sdpa"]
    found = localize(trace.records)
    assert found["culprit"] == "model.layers.0.self_attn.attention_fn"
    first = found["first_nonfinite_grad"]
    assert first["what"] == "query" and first["bad_at"] == [[1, 0], [1, 1]]  # row 1's two left-pad positions
    assert first["bad_positions"] == 2 and first["bad_in_fully_masked_queries"] == 2


def test_padding_and_mask_facts_by_hand():
    am = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]])
    facts = padding_facts(am)
    assert facts["fully_masked_query_positions"] == 0 + 2 + 3
    assert facts["rows_left_padded"] == 2 and facts["max_left_pad"] == 3
    additive = torch.tensor([[0.0, torch.finfo(torch.float32).min], [torch.finfo(torch.float32).min] * 2])
    assert fully_masked_rows(additive).tolist() == [False, True]


def test_masked_row_sdpa_check_counts_the_masked_rows():
    out = masked_row_sdpa_grads("cpu", torch.float32, rows=2, seq=8, head_dim=16, left_pad=(0, 3))
    assert out["fully_masked_query_rows"] == 3  # the second row's 3 left-pad queries
    assert set(out["MATH"]) >= {"output_finite", "grad_finite"} or "error" in out["MATH"]


def test_catcher_keeps_the_first_micro_batch_with_a_non_finite_gradient():
    """The update's order: zero_grad, then per micro-batch mb_log_probs + backward; the second micro-batch's row
    makes NaN, and the catcher keeps that one (not the first, not the third) with the weights that produced it."""
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class Pol:
        def __init__(self):
            self.model, self.optimizer = model, optimizer

        def mb_log_probs(self, mb, with_entropy):
            return self.model(mb["x"]).sqrt(), None  # sqrt of a negative: NaN forward and backward

    policy = Pol()
    catcher = NonFiniteGradCatcher(policy)
    model.train()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0]]))
        model.bias.zero_()
    batches = [Batch({"x": torch.tensor([[1.0, 0.0]])}), Batch({"x": torch.tensor([[-4.0, 0.0]])}),
               Batch({"x": torch.tensor([[9.0, 0.0]])})]
    policy.optimizer.zero_grad(set_to_none=True)
    for mb in batches:
        lp, _ = policy.mb_log_probs(mb, False)
        lp.sum().backward()
    assert not grads_finite(model)
    policy.optimizer.zero_grad(set_to_none=True)
    cap = catcher.capture
    assert cap is not None and cap["micro_batch"]["x"].tolist() == [[-4.0, 0.0]]
    assert cap["where"] == {"zero_grads": 1, "micro_batch_in_mini": 2}
    assert cap["state"]["weight"].tolist() == [[1.0, 0.0]]
    assert grads_finite(model)  # cleared


def test_compared_counts_non_finite_values_and_measures_the_rest_by_hand():
    # out [1, nan, 3, inf] against ref [1.5, 2, 5, 4]: 2 values not finite; where both are, |1 - 1.5| and |3 - 5|
    out = compared(torch.tensor([1.0, float("nan"), 3.0, float("inf")]), torch.tensor([1.5, 2.0, 5.0, 4.0]))
    assert out == {"finite": False, "nonfinite_count": 2, "ref_finite": True, "max_abs_diff": 2.0, "ref_max_abs": 5.0}
    # a bf16 output is read as float32: 1/3 in bf16 is 0.333984375, 0.000651... from the float32 reference
    third = compared(torch.tensor([1 / 3], dtype=torch.bfloat16), torch.tensor([1 / 3]))
    assert third["finite"] and abs(third["max_abs_diff"] - (0.333984375 - 1 / 3)) < 1e-7
    # nothing finite in both: no difference to report
    assert compared(torch.tensor([float("nan")]), torch.tensor([1.0]))["max_abs_diff"] is None
