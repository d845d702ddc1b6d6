"""The GPU benchmarks' response-length distribution (reasonrl/bench/lengths.py): seeded, bounded, long-tailed; and the
per-sample max_tokens wrapper splitting and regrouping vLLM requests (real ``vllm.SamplingParams``)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from reasonrl.bench.lengths import response_lengths, with_per_sample_lengths


def test_longtail_is_seeded_bounded_and_long_tailed():
    lengths = response_lengths("longtail", 512, 2048, median=400, seed=0)
    assert lengths == response_lengths("longtail", 512, 2048, median=400, seed=0)
    assert lengths != response_lengths("longtail", 512, 2048, median=400, seed=1)
    assert min(lengths) >= 16 and max(lengths) == 2048  # sigma 0.8: P(> 2048) ~ 2%, so some of 512 hit the cap
    median = sorted(lengths)[256]
    assert 340 <= median <= 460
    assert sum(lengths) / len(lengths) > median  # a long right tail: mean above median
    assert response_lengths("fixed", 3, 1024) == [1024] * 3
    with pytest.raises(ValueError, match="unknown length distribution"):
        response_lengths("uniform", 3, 10)


def test_sigma_scales_each_draws_distance_from_the_median():
    """A log-normal draw is median * exp(sigma * z), the same z for the same seed: doubling sigma doubles each
    draw's log-distance from the median (where neither the cap nor rounding interferes)."""
    import math

    narrow = response_lengths("longtail", 64, 10**9, median=1000, min_len=1, seed=3, sigma=0.5)
    wide = response_lengths("longtail", 64, 10**9, median=1000, min_len=1, seed=3, sigma=1.0)
    assert response_lengths("longtail", 64, 10**9, median=1000, min_len=1, seed=3) == \
        response_lengths("longtail", 64, 10**9, median=1000, min_len=1, seed=3, sigma=0.8)  # the default
    far = [(a, b) for a, b in zip(narrow, wide) if abs(math.log(a / 1000)) > 0.2]  # rounding is < 0.1% there
    assert len(far) > 20
    for a, b in far:
        assert math.log(b / 1000) == pytest.approx(2 * math.log(a / 1000), rel=0.01)
    assert max(wide) > max(narrow) and min(wide) < min(narrow)


def test_wrapper_gives_each_sample_its_length_and_regroups_by_request():
    from vllm import SamplingParams

    calls = []

    def fake_generate(prompts, params, **kwargs):
        calls.append((prompts, params))
        params = params if isinstance(params, list) else [params] * len(prompts)
        return [SimpleNamespace(prompt=p, outputs=[SimpleNamespace(index=0, max_tokens=sp.max_tokens)])
                for p, sp in zip(prompts, params)]

    generate = with_per_sample_lengths(fake_generate, [5, 7, 9, 11])
    out = generate(["a", "b"], SamplingParams(n=2, max_tokens=64, ignore_eos=True), use_tqdm=False)
    prompts, params = calls[0]
    assert prompts == ["a", "a", "b", "b"] and [p.n for p in params] == [1, 1, 1, 1]
    assert [p.max_tokens for p in params] == [5, 7, 9, 11]
    assert [o.prompt for o in out] == ["a", "b"]
    assert [[c.max_tokens for c in o.outputs] for o in out] == [[5, 7], [9, 11]]
    assert [[c.index for c in o.outputs] for o in out] == [[0, 1], [0, 1]]
    # Calls that stop at EOS (e.g. prompt log-prob requests) pass through unchanged.
    plain = SamplingParams(max_tokens=1)
    generate(["c"], plain)
    assert calls[1] == (["c"], plain)


def test_a_sample_generated_in_segments_keeps_its_length():
    """Lengths [5, 12]; segments of at most 4 tokens (partial rollouts). Call 1 (both fresh): 4 and 4 tokens, owing 1
    and 8. Call 2 continues both from prompt + output: 1 (done: fewer than asked) and 4, owing 4. Call 3: 4 -> the
    second sample has 4 + 4 + 4 = 12 tokens in all; no fresh length was drawn after the first call."""
    from vllm import SamplingParams

    counter = iter(range(1000))

    def fake_generate(prompts, params, **kwargs):
        return [SimpleNamespace(prompt=p, outputs=[SimpleNamespace(
            index=0, token_ids=[next(counter) for _ in range(sp.max_tokens)])]) for p, sp in zip(prompts, params)]

    generate = with_per_sample_lengths(fake_generate, [5, 12])
    seg = SamplingParams(n=2, max_tokens=4, ignore_eos=True)
    first = generate([{"prompt_token_ids": [900, 901]}], seg)[0].outputs
    assert [len(c.token_ids) for c in first] == [4, 4]
    one = SamplingParams(n=1, max_tokens=4, ignore_eos=True)
    second = generate([{"prompt_token_ids": [900, 901, *c.token_ids]} for c in first], one)
    assert [len(o.outputs[0].token_ids) for o in second] == [1, 4]
    third = generate([{"prompt_token_ids": [900, 901, *first[1].token_ids, *second[1].outputs[0].token_ids]}], one)
    assert len(third[0].outputs[0].token_ids) == 4
    fresh = generate([{"prompt_token_ids": [7]}], one)  # a new prompt draws the next length: 5 again, cut to 4
    assert len(fresh[0].outputs[0].token_ids) == 4


def test_a_call_of_fresh_prompts_between_segments_does_not_forget_what_is_owed():
    """The continuous fleet: lengths [10, 3]; call 1 cuts the first sample at 4 (owing 6); call 2 holds only a fresh
    prompt (length 3); call 3 continues the first sample, which still gets its 6 (cut to 4, then 2), not a fresh
    length (10 again, had call 2 forgotten it)."""
    from vllm import SamplingParams

    def fake_generate(prompts, params, **kwargs):
        return [SimpleNamespace(prompt=p, outputs=[SimpleNamespace(index=0, token_ids=[3] * sp.max_tokens)])
                for p, sp in zip(prompts, params)]

    generate = with_per_sample_lengths(fake_generate, [10, 3])
    one = SamplingParams(n=1, max_tokens=4, ignore_eos=True)
    first = generate([{"prompt_token_ids": [1]}], one)[0].outputs[0].token_ids
    assert len(first) == 4
    assert len(generate([{"prompt_token_ids": [2]}], one)[0].outputs[0].token_ids) == 3  # fresh: the next length
    second = generate([{"prompt_token_ids": [1, *first]}], one)[0].outputs[0].token_ids
    assert len(second) == 4  # 6 owed, cut to the segment's 4
    third = generate([{"prompt_token_ids": [1, *first, *second]}], one)[0].outputs[0].token_ids
    assert len(third) == 2  # 10 in all: 4 + 4 + 2


def test_a_length_that_fills_its_last_segment_owes_one_token_more():
    """Length 8 in segments of 4: 4, then 4 (it filled the cap, owing 0), then the continuation gets vLLM's least, 1
    token (the sample is 9 long): the documented +1, never a fresh length."""
    from vllm import SamplingParams

    def fake_generate(prompts, params, **kwargs):
        return [SimpleNamespace(prompt=p, outputs=[SimpleNamespace(index=0, token_ids=[5] * sp.max_tokens)])
                for p, sp in zip(prompts, params)]

    generate = with_per_sample_lengths(fake_generate, [8, 100])
    one = SamplingParams(n=1, max_tokens=4, ignore_eos=True)
    got, prompt = [], [1]
    for _ in range(3):
        out = generate([{"prompt_token_ids": prompt}], one)[0].outputs[0].token_ids
        got.append(len(out))
        prompt = prompt + list(out)
    assert got == [4, 4, 1]


def test_requests_added_to_the_engine_take_the_lengths_in_turn():
    """``rollout.partial_mode=in_engine`` adds one request per sample to vLLM's engine: lengths [5, 70] against a cap
    of 64 give max_tokens 5, then 64 (cut to the cap), then 5 again (the list wraps); a request that stops at EOS and
    one of several samples pass unchanged, and the caller's params are not changed."""
    from vllm import SamplingParams

    from reasonrl.bench.lengths import with_per_sample_added_lengths

    added = []
    add = with_per_sample_added_lengths(lambda rid, prompt, params, **kw: added.append((rid, params, kw)), [5, 70])
    params = SamplingParams(n=1, max_tokens=64, ignore_eos=True)
    for rid in ("r0", "r1", "r2"):
        add(rid, {"prompt_token_ids": [1, 2]}, params, lora_request=None)
    assert [(rid, p.max_tokens) for rid, p, _ in added] == [("r0", 5), ("r1", 64), ("r2", 5)]
    assert params.max_tokens == 64 and added[0][2] == {"lora_request": None}
    plain, several = SamplingParams(max_tokens=8), SamplingParams(n=2, max_tokens=8, ignore_eos=True)
    add("r3", {"prompt_token_ids": [1]}, plain)
    add("r4", {"prompt_token_ids": [1]}, several)
    assert added[3][1] is plain and added[4][1] is several
