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
