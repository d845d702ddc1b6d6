"""The engine host: a rollout engine in a worker's process, what it generates with (the engine, or the tool loop
around it), its sleep/wake phases, and the engine side of a weight sync, written once for both worker kinds.

A sync is a stream of buckets of (Hugging Face name, full tensor) pairs; where they come from is the only difference
between the workers: ``ActorRolloutRefWorker`` gathers them from its own FSDP actor (in-process tensors), a
``RolloutWorker`` receives them from the weight transfer group. ``load_weights`` takes either stream.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from reasonrl.config.worker_plan import WorkerPlan
from reasonrl.data.batch import Batch
from reasonrl.data.sample import EnvOutcome, Sample, ToolOutcome
from reasonrl.rollout import SLEEP_PARTS, SamplingParams
from reasonrl.rollout.multiturn import ToolRollout
from reasonrl.rollout.weight_sync import tensor_nbytes

NamedTensor = Tuple[str, torch.Tensor]


PROMPT_ROWS = "rows"
"""The meta key of a prompt batch's dataset rows (``trainer.streaming.prompt_batch``), one per prompt: the multi-turn
loop resets each prompt's environment with its own row. A batch without it runs every prompt in ``env.default``."""

PROMPT_GROUPS = "groups"
"""The meta key of a prompt batch's group ids (``trainer.streaming.prompt_batch``: each prompt's position in its
round), one per prompt, which the prompt's Samples carry. A batch without it numbers its prompts from 0."""


def completions_to_samples(groups: Sequence[int], results, with_tools: bool = False) -> List[Sample]:
    """One ``Sample`` per completion, grouped by prompt, each carrying its prompt's group id from ``groups``;
    ``with_tools``: the multi-turn loop's trajectories, with their tool mask and the tools' and the environment's
    outcomes. The engine's lists are kept as they are (no per-token copies). A partial rollout's completions also give
    each Sample its per-token versions, its oldest and newest version, and ``weights_version`` = the oldest."""
    out: List[Sample] = []
    for group, completions in zip(groups, results):
        for c in completions:
            out.append(Sample(group=int(group), response_ids=c.token_ids, response_text=c.text,
                              rollout_log_probs=c.logprobs, finish_reason=c.finish_reason,
                              tool_mask=c.tool_mask if with_tools else None,
                              tools=ToolOutcome.of(c) if with_tools else None,
                              env=EnvOutcome.of(c) if with_tools else None))
            versions = getattr(c, "versions", None)  # a partial rollout's (``rollout.partial.VersionedCompletion``)
            if versions:
                s = out[-1]
                s.token_versions, s.oldest_version, s.newest_version = versions, versions[0], versions[-1]
                s.weights_version = versions[0]
                s.joined_running = bool(getattr(c, "joined", False))
    return out


def rollout_generator(engine, tokenizer, cfg, tools: bool):
    """What a worker generates with: the engine, or with ``tools`` (the plan's generator) the multi-turn tool loop
    around it (``rollout/multiturn.py``). Both worker kinds use it, so a task with tools runs its tools in either
    mode."""
    return ToolRollout.from_config(engine, tokenizer, cfg) if tools else engine


def generate_chunks(generator, prompt_ids: Sequence[Sequence[int]], sampling: Dict[str, Any],
                    chunk_prompts: int, with_tools: bool = False,
                    rows: Optional[Sequence[Dict[str, Any]]] = None,
                    groups: Optional[Sequence[int]] = None) -> Iterator[List[Sample]]:
    """``generator``'s (an engine's, or the tool loop's) responses to ``prompt_ids`` as Samples, in consecutive
    lists of ``chunk_prompts`` prompts' responses each (0: one list for all): concatenated, they equal one generate
    call's. Each prompt's Samples carry its group id from ``groups`` (None: its position in the call). ``with_tools``:
    the generator is the tool loop, handed each prompt's dataset row from ``rows``."""
    params = SamplingParams(**sampling)
    if rows is not None and len(rows) != len(prompt_ids):
        raise ValueError(f"{len(rows)} dataset rows for {len(prompt_ids)} prompts")
    if groups is not None and len(groups) != len(prompt_ids):
        raise ValueError(f"{len(groups)} group ids for {len(prompt_ids)} prompts")
    groups = list(range(len(prompt_ids))) if groups is None else list(groups)
    size = chunk_prompts if chunk_prompts > 0 else max(1, len(prompt_ids))
    for start in range(0, len(prompt_ids), size):
        part = list(prompt_ids[start:start + size])
        if with_tools:
            out = generator.generate(part, params, rows=None if rows is None else list(rows[start:start + size]))
        else:
            out = generator.generate(part, params)
        yield completions_to_samples(groups[start:start + size], out, with_tools)


def make_engine(cfg, plan: WorkerPlan, model_path: str, tokenizer, dtype: torch.dtype, device: str,
                sleep_level: int = 1):
    """The worker's rollout engine (the plan's engine, at its ``max_model_len``); a vLLM engine that will take
    adapter-only syncs (``lora_sync=adapter``) starts with LoRA enabled at the adapter's rank. ``sleep_level``: the
    plan's ``engine_sleep_level`` (vLLM on GPU)."""
    from reasonrl.rollout import make_rollout_engine

    return make_rollout_engine(replace(cfg.rollout, engine=plan.engine), model_path, tokenizer, dtype, device,
                               plan.max_model_len, lora_rank=cfg.actor.lora.rank if plan.lora_sync == "adapter" else 0,
                               sleep_level=sleep_level)


class EngineHost:
    """One rollout engine (``engine``) and its phases, for the worker that holds it; ``tools``: rollouts run the
    multi-turn tool loop around it (the plan's ``WorkerPlan.tools``)."""

    def __init__(self, engine, tokenizer, cfg, device: str, tools: bool, start_seconds: float = 0.0) -> None:
        self.engine, self.tokenizer, self.cfg, self.device, self.tools = engine, tokenizer, cfg, device, tools
        self.start_seconds = start_seconds
        """Seconds the engine took to start (the trainer's ``startup_s/engine_start``)."""
        self._generator = None  # the multi-turn loop around the engine (with tools), built on first use

    def use_generator(self, generator) -> None:
        """Generate with ``generator`` (the engine's ``generate`` signature) instead of the engine: partial rollouts'
        ``SegmentedGenerator`` around it (``rollout.partial``; not with tools, which the config refuses)."""
        self._generator = generator

    @property
    def generator(self):
        """The engine, or the multi-turn tool loop around it with ``tools`` (``rollout/multiturn.py``), or what
        ``use_generator`` set."""
        if self._generator is None:
            self._generator = rollout_generator(self.engine, self.tokenizer, self.cfg, self.tools)
        return self._generator

    def generate_chunks(self, prompts: Batch, sampling: dict, chunk_prompts: int) -> Iterator[List[Sample]]:
        """The Samples for a prompt batch (meta ``prompt_ids``; ``rows``: the dataset rows the tool loop resets
        environments with; ``groups``: the prompts' group ids) as lists of ``chunk_prompts`` prompts' responses (0:
        one list)."""
        rows = prompts[PROMPT_ROWS] if PROMPT_ROWS in prompts else None
        groups = prompts[PROMPT_GROUPS] if PROMPT_GROUPS in prompts else None
        return generate_chunks(self.generator, prompts["prompt_ids"], sampling, chunk_prompts, self.tools, rows,
                               groups)

    # ------------------------------------------------------------------ memory phases
    def sleep(self) -> float:
        """Free the engine's weights and KV cache (vLLM on GPU with ``rollout.free_cache_engine``; elsewhere a
        no-op). Seconds taken."""
        start = time.perf_counter()
        engine = self.engine
        if engine.supports_sleep and self.cfg.rollout.free_cache_engine and not engine.asleep_parts:
            engine.sleep()
        return time.perf_counter() - start

    def wake(self, parts: Sequence[str] = SLEEP_PARTS) -> None:
        """Bring back those of ``parts`` ("weights", "kv_cache") that are asleep."""
        engine = self.engine
        parts = [p for p in parts if p in engine.asleep_parts]
        if not parts:
            return
        if self.device == "cuda":  # hand the update's cached blocks back before vLLM re-maps its memory
            torch.cuda.empty_cache()
        engine.wake_up(parts)

    # ------------------------------------------------------------------ weight sync
    def load_weights(self, buckets: Iterable[List[NamedTensor]]) -> int:
        """One weight sync: the engine's weights woken first, every bucket loaded, the sync finished (vLLM on CPU:
        the layerwise reload session closed), then the KV cache woken. Returns the bytes loaded."""
        self.wake(("weights",))  # the weights first: the KV cache takes its memory after the update
        moved = 0
        for bucket in buckets:
            self.engine.update_weights(bucket)
            moved += sum(tensor_nbytes(t) for _, t in bucket)
        self.engine.finish_weight_update()
        self.wake(("kv_cache",))
        return moved

    def load_adapter(self, named_tensors: Iterable[NamedTensor], adapter_config: dict) -> int:
        """A LoRA adapter-only sync (``actor.lora.merge_for_rollout=false``): the engine's weights woken, the adapter
        (PEFT's saved names) loaded by the engine (hf: onto its base copy; vLLM: a new ``LoRARequest``), the KV cache
        woken. Returns the bytes loaded."""
        tensors = list(named_tensors)
        self.wake(("weights",))
        self.engine.load_adapter(tensors, adapter_config)
        self.wake(("kv_cache",))
        return sum(tensor_nbytes(t) for _, t in tensors)

    def sequence_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> List[float]:
        """The engine's log-probs (temperature 1) of ``response_ids`` after ``prompt_ids``."""
        return self.engine.sequence_logprobs([list(prompt_ids)], [list(response_ids)])[0]
