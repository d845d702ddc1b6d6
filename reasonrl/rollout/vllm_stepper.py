"""Generation one vLLM engine step at a time, with a call between two steps (``VLLMRolloutEngine.generate_steps``).

``LLM.generate`` adds its requests and runs ``LLMEngine.step()`` until all are finished, with nothing in between.
Here the requests go onto the same ``LLMEngine`` (ids ``REQUEST_PREFIX`` + a counter, apart from ``LLM``'s own
plain counter), one request of one sample for each of a prompt's ``n`` samples (as vLLM's own parallel sampling
runs them: a child request each, unseeded; one request per sample also lets the GPU benchmark give each sample its
own length through ``add_request``, ``bench/lengths.py``), asking for delta outputs (``vllm_compat.delta_params``:
each step's new tokens only), and the loop
calls ``before_step()`` before every step. That call may change the engine's weights (partial rollouts in
``rollout.partial_mode=in_engine``): the requests stay in the engine with their KV cache, and later tokens come from
the new weights ("pause and keep"). It returns the weight version that the next step runs under, which stamps the
tokens that step produces (so the engine must not run steps ahead of ``step()``: asynchronous scheduling off, see
``vllm_compat.engine_kwargs``).

``Stream`` and ``absorb`` are the pure bookkeeping of one sample (tests/unit/rollout/test_vllm_stepper.py);
``Requests`` is one call's requests and Streams, which ``step_loop.StepLoop`` also uses (calls sharing one loop).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from . import vllm_compat

REQUEST_PREFIX = "reasonrl-step-"
_ids = itertools.count()


def finish_reason(reason) -> str:
    """vLLM's finish reason as a ``Completion``'s: ``stop`` and ``length`` as they are, anything else as a string."""
    return reason if reason in ("stop", "length") else str(reason)


@dataclass
class Stream:
    """One sample as its deltas arrive: tokens, their log-probs (when asked for), the version of each token."""

    token_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    versions: List[int] = field(default_factory=list)
    finish_reason: str = ""
    """"" while unfinished."""


def absorb(stream: Stream, token_ids: Sequence[int], logprobs: Sequence[float], reason: Optional[str],
           version: int) -> None:
    """Append one step's delta of a sample: ``token_ids`` (maybe none), their ``logprobs`` (one each, or none when
    not asked for), produced under ``version``; ``reason`` is vLLM's finish reason once the sample is done (None
    before)."""
    if stream.finish_reason:
        raise ValueError("a delta for a finished sample")
    if logprobs and len(logprobs) != len(token_ids):
        raise ValueError(f"{len(logprobs)} log-probs for {len(token_ids)} tokens")
    if stream.versions and version < stream.versions[-1]:
        raise ValueError(f"version {version} after version {stream.versions[-1]}")
    stream.token_ids += list(token_ids)
    stream.logprobs += list(logprobs)
    stream.versions += [version] * len(token_ids)
    if reason is not None:
        stream.finish_reason = finish_reason(reason)


@dataclass
class Requests:
    """One call's requests: a prompt's ``n`` samples as ``n`` requests of one sample each, and their Streams."""

    prompts: Sequence[Sequence[int]]
    params: object
    """The call's vLLM SamplingParams (``n`` samples per prompt)."""
    lora_request: object
    ids: List[str] = field(default_factory=list)
    streams: Dict[str, Stream] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ids = [f"{REQUEST_PREFIX}{next(_ids)}" for _ in range(len(self.prompts) * self.params.n)]
        self.streams = {rid: Stream() for rid in self.ids}

    def add_to(self, engine) -> None:
        one = vllm_compat.delta_params(self.params)
        one.n = 1
        for i, rid in enumerate(self.ids):
            vllm_compat.add_request(engine, rid, self.prompts[i // self.params.n], one, self.lora_request)

    def unfinished(self) -> List[str]:
        return [rid for rid in self.ids if not self.streams[rid].finish_reason]

    def groups(self) -> List[List[Stream]]:
        """For each prompt, its ``n`` Streams."""
        n = self.params.n
        return [[self.streams[rid] for rid in self.ids[i * n:(i + 1) * n]] for i in range(len(self.prompts))]


def absorb_output(streams: Dict[str, Stream], out, version: int) -> Stream:
    """One step's RequestOutput ``out`` into its request's Stream (which it returns)."""
    stream = streams.get(out.request_id)
    if stream is None:
        raise RuntimeError(f"the engine returned request {out.request_id!r}, not one of this call's")
    for c in out.outputs:
        absorb(stream, c.token_ids, vllm_compat.sampled_logprobs(c), c.finish_reason, version)
    return stream


def run(llm, prompts: Sequence[Sequence[int]], params, lora_request, before_step: Callable[[], int]
        ) -> List[List[Stream]]:
    """For each prompt (token ids), ``params.n`` Streams (vLLM SamplingParams ``params``), stepping ``llm``'s engine
    until every request is done and calling ``before_step()`` before each step. Requests still unfinished when an
    exception leaves the loop are aborted."""
    engine = llm.llm_engine
    call = Requests(prompts, params, lora_request)
    try:
        call.add_to(engine)
        while engine.has_unfinished_requests():
            version = before_step()
            for out in engine.step():
                absorb_output(call.streams, out, version)
    except BaseException:
        unfinished = call.unfinished()
        if unfinished:
            engine.abort_request(unfinished)
        raise
    return call.groups()
