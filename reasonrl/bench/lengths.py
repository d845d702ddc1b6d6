"""Response lengths for the GPU step benchmarks, produced the same way for reasonrl and TRL.

``response_lengths`` draws one length per sample of a step: ``fixed`` gives every sample ``max_len`` (the issue's
first workload); ``longtail`` is a seeded log-normal with the given median (default 400) and sigma (default 0.8),
clipped to [``min_len``, ``max_len``] (with max 2048: ~2% of the samples hit the cap, mean ~540 tokens), like
reasoning traces.

``with_per_sample_lengths`` wraps a vLLM ``LLM.generate`` so that each sample of a call stops at its own length:
every request of n samples becomes n requests of one sample, the j-th sample of the call (in request order) gets
``max_tokens = lengths[j]``, and the outputs are regrouped per request. Only calls whose sampling parameters ignore
EOS are changed (the benchmarks' generation; vLLM's prompt-log-prob calls pass through). Both benchmarks put it on
the engine they drive: gpu_grpo_step.py on the worker's engine, gpu_trl_anchor.py on ``vllm.LLM.generate`` before
TRL builds its colocated engine; so both generate the same multiset of lengths every step.

``with_per_sample_added_lengths`` does the same for ``LLMEngine.add_request``, which partial rollouts in
``rollout.partial_mode=in_engine`` use instead of ``LLM.generate`` (``rollout/vllm_stepper.py``: one request per
sample, never cut, so each request that ignores EOS simply takes the next length).

Partial rollouts (``rollout.partial``, ``partial_mode=segments``) generate a response in segments: the first call of a
response asks for at most one segment, and each later call continues it from prompt + the tokens so far. The wrapper
keeps a sample's length across its segments: a fresh sample's length ``L`` is cut to the call's own ``max_tokens``
``M``, and when ``L > M`` the rest, ``L - M``, is owed to the call whose prompt is exactly this one's prompt + its
output (the continuation); such a prompt takes what it is owed (again cut to its call's cap) instead of a new length.
Only fresh samples draw from ``lengths``, so a step generates the same multiset of lengths in segments as in one call,
but for one thing: a length that is a multiple of the segment owes 0 after its last full segment, and since the
segmented generator continues a sequence that filled its segment, that continuation gets 1 token (vLLM's least), so such
a sample is 1 token longer. What is owed is kept until its continuation comes, whatever calls come between: the
continuous fleet (``fleet.continuous``) starts fresh groups in calls of their own while others are cut mid-response
(forgetting what was owed at such a call gave the continuations fresh lengths). The 311,211 response tokens of the first
partial step on a GPU against the 278,921 drawn (twenty-second and twenty-third sessions) had another cause: that batch
started before the wrapper was set (``async_step.warmup_steps``).
"""
from __future__ import annotations

import math
import random
from typing import Any, Callable, Dict, List, Sequence, Tuple

DISTRIBUTIONS = ("fixed", "longtail")
LONGTAIL_SIGMA = 0.8


def response_lengths(dist: str, count: int, max_len: int, median: int = 400, min_len: int = 16,
                     seed: int = 0, sigma: float = LONGTAIL_SIGMA) -> List[int]:
    """``count`` response lengths of distribution ``dist`` (see the module docstring), deterministic in ``seed``;
    ``sigma`` is the log-normal's (a larger one, a longer tail)."""
    if dist == "fixed":
        return [max_len] * count
    if dist != "longtail":
        raise ValueError(f"unknown length distribution {dist!r}; choose one of {DISTRIBUTIONS}")
    rng = random.Random(seed)
    mu = math.log(median)
    return [min(max_len, max(min_len, round(rng.lognormvariate(mu, sigma)))) for _ in range(count)]


def _token_ids(prompt: Any) -> Tuple[int, ...]:
    """A prompt's token ids (vLLM's ``{"prompt_token_ids": [...]}``); () for a text prompt."""
    return tuple(prompt.get("prompt_token_ids", ())) if isinstance(prompt, dict) else ()


def with_per_sample_lengths(generate: Callable, lengths: Sequence[int]) -> Callable:
    """``generate(prompts, sampling_params, ...)`` with per-sample ``max_tokens`` (see the module docstring)."""
    owed: Dict[Tuple[int, ...], int] = {}  # prompt + output so far -> tokens its continuation still has to give
    fresh = [0]  # fresh samples given a length so far

    def wrapped(prompts, sampling_params=None, *args, **kwargs):
        single = isinstance(prompts, (str, dict))
        prompts = [prompts] if single else list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if not params or any(p is None or not getattr(p, "ignore_eos", False) for p in params):
            return generate(prompts[0] if single else prompts, sampling_params, *args, **kwargs)
        flat_prompts: List[Any] = []
        flat_params: List[Any] = []
        wanted: List[int] = []
        for prompt, sp in zip(prompts, params):
            for _ in range(sp.n):
                key = _token_ids(prompt)
                if key and key in owed:
                    total = owed.pop(key)  # the continuation of a sample cut at an earlier call's cap
                else:
                    total = int(lengths[fresh[0] % len(lengths)])
                    fresh[0] += 1
                one = sp.clone()
                one.n = 1
                one.max_tokens = max(1, min(total, sp.max_tokens) if sp.max_tokens else total)
                flat_prompts.append(prompt)
                flat_params.append(one)
                wanted.append(total)
        outputs = generate(flat_prompts, flat_params, *args, **kwargs)
        for prompt, one, total, out in zip(flat_prompts, flat_params, wanted, outputs):
            if total >= one.max_tokens and _token_ids(prompt):  # it filled the call's cap: it may be continued
                owed[_token_ids(prompt) + tuple(out.outputs[0].token_ids)] = total - one.max_tokens
        grouped, start = [], 0
        for sp in params:
            part = outputs[start:start + sp.n]
            start += sp.n
            head = part[0]
            head.outputs = [o.outputs[0] for o in part]
            for index, completion in enumerate(head.outputs):
                completion.index = index
            grouped.append(head)
        return grouped

    return wrapped


def with_per_sample_added_lengths(add_request: Callable, lengths: Sequence[int]) -> Callable:
    """``add_request(request_id, prompt, params, ...)`` whose requests of one sample that ignore EOS take the next of
    ``lengths`` as ``max_tokens`` (cut to their own cap); other requests pass unchanged."""
    fresh = [0]  # requests given a length so far

    def wrapped(request_id, prompt, params, *args, **kwargs):
        if getattr(params, "ignore_eos", False) and getattr(params, "n", 1) == 1:
            total = int(lengths[fresh[0] % len(lengths)])
            fresh[0] += 1
            params = params.clone()
            params.max_tokens = max(1, min(total, params.max_tokens) if params.max_tokens else total)
        return add_request(request_id, prompt, params, *args, **kwargs)

    return wrapped
