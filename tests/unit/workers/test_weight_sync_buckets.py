"""Fast tests of the weight-sync helpers: bucketing, name normalization, log-prob comparison."""
import math

import pytest
import torch

from reasonrl.rollout.weight_sync import (
    iter_buckets,
    logprob_diff,
    normalize_param_name,
    reference_sequence_logprobs,
    sequence_logprobs_check,
    tensor_nbytes,
)


def _named(sizes, dtype=torch.float32):
    return [(f"p{i}", torch.zeros(n, dtype=dtype)) for i, n in enumerate(sizes)]


def test_buckets_greedy_fill_in_order():
    # float32: 10, 20, 5, 30 elements = 40, 80, 20, 120 bytes; bucket 100 bytes.
    # p0 (40) opens a bucket; p1 would make 120 > 100 -> [p0]; p1 + p2 = 100 <= 100 -> [p1, p2];
    # p3 (120) is larger than a bucket and travels alone -> [p3].
    buckets = list(iter_buckets(_named([10, 20, 5, 30]), bucket_bytes=100))
    assert [[name for name, _ in b] for b in buckets] == [["p0"], ["p1", "p2"], ["p3"]]


def test_buckets_bounded_and_complete():
    named = _named([7, 300, 1, 64, 64, 64, 2, 500, 3] * 3)
    bucket_bytes = 512
    buckets = list(iter_buckets(named, bucket_bytes))
    flat = [pair for b in buckets for pair in b]
    assert [n for n, _ in flat] == [n for n, _ in named]  # nothing lost, order kept
    for b in buckets:
        total = sum(tensor_nbytes(t) for _, t in b)
        assert total <= bucket_bytes or len(b) == 1  # only a single oversized tensor may exceed


def test_buckets_count_dtype_bytes():
    # bfloat16 takes 2 bytes: 50 elements = 100 bytes, so two fit exactly in 200 bytes and a third starts anew
    named = _named([50, 50, 50], dtype=torch.bfloat16)
    assert [len(b) for b in iter_buckets(named, 200)] == [2, 1]


def test_buckets_are_lazy():
    pulled = []

    def gen():
        for i in range(10):
            pulled.append(i)
            yield f"p{i}", torch.zeros(25)  # 100 bytes each

    it = iter_buckets(gen(), bucket_bytes=200)
    first = next(it)
    # two tensors fill the first bucket; the third was pulled to learn that it does not fit, no more
    assert len(first) == 2 and len(pulled) == 3


def test_buckets_edge_cases():
    assert list(iter_buckets([], 100)) == []
    with pytest.raises(ValueError):
        list(iter_buckets(_named([1]), 0))
    from reasonrl.config import load_config
    from reasonrl.config.plan import RunPlan

    def bucket(mb: str) -> int:
        return RunPlan.build(load_config([f"rollout.weight_sync_bucket_mb={mb}"], cuda_available=False)[0]).bucket_bytes

    assert bucket("2") == 2 * 1024 * 1024
    assert bucket("3") == 3 * 1024 * 1024


@pytest.mark.parametrize("raw, plain", [
    ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("_orig_mod.model.norm.weight", "model.norm.weight"),
    ("model.layers.3._checkpoint_wrapped_module.mlp.up_proj.weight", "model.layers.3.mlp.up_proj.weight"),
    ("_fsdp_wrapped_module.model.embed_tokens.weight", "model.embed_tokens.weight"),
    ("module.lm_head.weight", "lm_head.weight"),
    ("model.module.weight", "model.module.weight"),  # a real submodule called "module" is kept
])
def test_normalize_param_name(raw, plain):
    assert normalize_param_name(raw) == plain


def test_logprob_diff_hand_numbers():
    # |-1.0 - -1.5| = 0.5, |-2.0 - -2.0| = 0, |-0.1 - -0.4| = 0.3 -> max 0.5, mean 0.8 / 3
    d = logprob_diff([-1.0, -2.0, -0.1], [-1.5, -2.0, -0.4])
    assert d.max_abs == pytest.approx(0.5)
    assert d.mean_abs == pytest.approx(0.8 / 3)
    assert d.num_tokens == 3
    assert d.as_metrics() == {"weight_sync/logprob_diff_max": d.max_abs, "weight_sync/logprob_diff_mean": d.mean_abs}
    with pytest.raises(ValueError):
        logprob_diff([-1.0], [-1.0, -2.0])


class _UniformLM(torch.nn.Module):
    """A real (if trivial) causal LM: logits are zero over a 4-token vocabulary at every position."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(4))

    def forward(self, input_ids):
        return type("Out", (), {"logits": self.bias.expand(*input_ids.shape, 4)})()


def test_reference_sequence_logprobs_uniform():
    # uniform over 4 tokens: every token has log-prob log(1/4) = -1.386..., one per token after the first
    lp = reference_sequence_logprobs(_UniformLM(), [0, 3, 1, 2])
    assert lp.shape == (3,)
    assert torch.allclose(lp, torch.full((3,), -math.log(4.0)))
    with pytest.raises(ValueError):
        reference_sequence_logprobs(_UniformLM(), [1])


def _tiny_llama(seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def test_sequence_logprobs_check_with_hf_engine(model_path):
    """The check's engine side through the real hf engine (a tiny random Llama): same weights agree to float
    noise; a perturbed reference disagrees by far more."""
    from reasonrl.models import load_tokenizer
    from reasonrl.rollout.hf_engine import HFRolloutEngine

    tok = load_tokenizer(model_path)  # the real SmolLM2 tokenizer; its pad id (2) is inside the tiny vocab
    engine = HFRolloutEngine(_tiny_llama(0), tok)
    reference = _tiny_llama(0)
    seq = [5, 9, 17, 33, 2, 40, 11, 7]
    same = sequence_logprobs_check(engine, reference, seq)
    assert same.num_tokens == len(seq) - 1
    assert same.max_abs < 1e-5
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    moved = sequence_logprobs_check(engine, reference, seq)
    assert moved.max_abs > 100 * max(same.max_abs, 1e-5)
