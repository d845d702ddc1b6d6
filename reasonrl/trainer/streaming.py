"""Rewards while generating: hand each finished chunk of responses to the verifier pool while the rest generate.

``generate_and_verify`` is the rollout + verify of one round. With ``rollout.stream_chunk_prompts`` > 0 every worker
generates its share in sub-batches (a Ray streaming call, ``WorkerGroup.stream``) and each sub-batch's responses go to
the pool (``VerifierPool.submit``) the moment they arrive, so verifying overlaps generating; ``timing_s/verify`` is then
only what is left after the last response. With 0 it is one generate call, then one ``verify_batch``. Either way the
rows come back in the order of one plain generate call (rank by rank, prompt by prompt) with results in that order.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import ray

from reasonrl.data.batch import Batch
from reasonrl.rewards import verify_item

from .metrics import PhaseTimer


class GenerationError(RuntimeError):
    """A worker of the generating group failed (raised, or its process died) while generating."""


def _prompt_batch(prompts: Sequence[Any]) -> Batch:
    return Batch(meta={"prompt_ids": [p.token_ids for p in prompts]})


def generate_and_verify(group, prompts: Sequence[Any], sampling: Dict[str, Any], pool, reward_cfg,
                        chunk_prompts: int, timer: PhaseTimer) -> Tuple[Batch, List[Any]]:
    """Responses (``rollout.n`` per prompt, grouped) and their verifier results; times ``rollout`` and ``verify``."""
    if chunk_prompts <= 0:
        with timer("rollout"):
            gen = group.generate(_prompt_batch(prompts), sampling)
        return gen, verify_rows(gen, prompts, pool, reward_cfg, timer)
    return collect_stream(group, start_stream(group, prompts, sampling, chunk_prompts), prompts, pool, reward_cfg,
                          timer)


def verify_rows(gen: Batch, prompts: Sequence[Any], pool, reward_cfg, timer: PhaseTimer) -> List[Any]:
    n = len(gen) // max(1, len(prompts))
    with timer("verify"):
        return pool.verify_batch([verify_item(prompts[j // n].row, text, reward_cfg)
                                  for j, text in enumerate(gen["response_text"])])


def start_stream(group, prompts: Sequence[Any], sampling: Dict[str, Any], chunk_prompts: int) -> List[Any]:
    """Start the streaming generate calls (one per rank); returns their generators for ``collect_stream``."""
    return group.stream("generate_stream", _prompt_batch(prompts), sampling, chunk_prompts)


def collect_stream(group, streams: List[Any], prompts: Sequence[Any], pool, reward_cfg,
                   timer: PhaseTimer) -> Tuple[Batch, List[Any]]:
    """Read the engines' chunks as they come, submitting each to the pool at once; then wait for the results. With
    tensor-parallel engines only each engine's first rank's chunks are rows; the other ranks' streams are drained."""
    heads = group.stream_heads(streams)
    per_engine = len(prompts) // len(heads)
    pieces: List[List[Batch]] = [[] for _ in heads]
    submissions: List[List[Any]] = [[] for _ in heads]
    engine_of = {stream: e for e, stream in enumerate(heads)}
    active = {stream: rank for rank, stream in enumerate(streams)}
    name = getattr(group.worker_cls, "__name__", "worker")
    with timer("rollout"):
        while active:
            ready, _ = ray.wait(list(active), num_returns=1)
            stream = ready[0]
            rank = active[stream]
            try:
                part = ray.get(next(stream))
            except StopIteration:
                del active[stream]
                continue
            except ray.exceptions.RayError as exc:
                raise GenerationError(f"{name} rank {rank} failed while generating: {exc}") from exc
            if stream not in engine_of:  # a tensor-parallel engine's other rank: the same rows again
                continue
            engine = engine_of[stream]
            rows = [prompts[engine * per_engine + i].row for i in part["prompt_row"]]
            submissions[engine].append(pool.submit([verify_item(row, text, reward_cfg)
                                                    for row, text in zip(rows, part["response_text"])]))
            pieces[engine].append(part)
    with timer("verify"):  # only what verification has left once the last response is in
        results = [r for subs in submissions for sub in subs for r in sub.result()]
    return Batch.concat([p for parts in pieces for p in parts]), results
