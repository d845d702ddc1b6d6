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
from reasonrl.rollout import SLEEP_PARTS, SamplingParams
from reasonrl.rollout.multiturn import ToolRollout, tool_meta
from reasonrl.rollout.weight_sync import tensor_nbytes

NamedTensor = Tuple[str, torch.Tensor]


PROMPT_ROWS = "rows"
"""The meta key of a prompt batch's dataset rows (``trainer.streaming.prompt_batch``), one per prompt: the multi-turn
loop resets each prompt's environment with its own row. A batch without it runs every prompt in ``env.default``."""

ROW_FIELDS = ("prompt_ids", "response_ids", "rollout_log_probs", "response_text", "finish_reason", "prompt_row")


def completions_to_batch(prompt_ids: Sequence[Sequence[int]], results, first_row: int = 0,
                         with_tools: bool = False) -> Batch:
    """One row per completion, grouped by prompt, with meta ``ROW_FIELDS`` (``prompt_row``: the prompt's position
    in the call, counting from ``first_row``); ``with_tools``: the multi-turn loop's per-row ``tool_mask`` and tool
    counts too. The engine's lists are kept as they are (no per-token copies), one prompt list per prompt."""
    meta: Dict[str, List[Any]] = {k: [] for k in ROW_FIELDS}
    for i, (prompt, completions) in enumerate(zip(prompt_ids, results)):
        prompt = list(prompt)  # shared by the prompt's samples: Ray's pickle sends it once
        for c in completions:
            meta["prompt_ids"].append(prompt)
            meta["response_ids"].append(c.token_ids)
            meta["rollout_log_probs"].append(c.logprobs)
            meta["response_text"].append(c.text)
            meta["finish_reason"].append(c.finish_reason)
            meta["prompt_row"].append(first_row + i)
    if with_tools:
        meta.update(tool_meta([c for completions in results for c in completions]))
    return Batch(meta=meta)


def rollout_generator(engine, tokenizer, cfg, tools: bool):
    """What a worker generates with: the engine, or with ``tools`` (the plan's generator) the multi-turn tool loop
    around it (``rollout/multiturn.py``). Both worker kinds use it, so a task with tools runs its tools in either
    mode."""
    return ToolRollout.from_config(engine, tokenizer, cfg) if tools else engine


def generate_chunks(generator, prompt_ids: Sequence[Sequence[int]], sampling: Dict[str, Any],
                    chunk_prompts: int, with_tools: bool = False,
                    rows: Optional[Sequence[Dict[str, Any]]] = None) -> Iterator[Batch]:
    """``generator``'s (an engine's, or the tool loop's) responses to ``prompt_ids`` as consecutive Batches of
    ``chunk_prompts`` prompts' responses each (0: one Batch for all): concatenated, they equal one generate call's
    rows. ``with_tools``: the generator is the tool loop, handed each prompt's dataset row from ``rows``."""
    params = SamplingParams(**sampling)
    if rows is not None and len(rows) != len(prompt_ids):
        raise ValueError(f"{len(rows)} dataset rows for {len(prompt_ids)} prompts")
    size = chunk_prompts if chunk_prompts > 0 else max(1, len(prompt_ids))
    for start in range(0, len(prompt_ids), size):
        part = list(prompt_ids[start:start + size])
        if with_tools:
            out = generator.generate(part, params, rows=None if rows is None else list(rows[start:start + size]))
        else:
            out = generator.generate(part, params)
        yield completions_to_batch(part, out, start, with_tools)


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

    @property
    def generator(self):
        """The engine, or the multi-turn tool loop around it with ``tools`` (``rollout/multiturn.py``)."""
        if self._generator is None:
            self._generator = rollout_generator(self.engine, self.tokenizer, self.cfg, self.tools)
        return self._generator

    def generate_chunks(self, prompts: Batch, sampling: dict, chunk_prompts: int):
        """The generated rows for a prompt batch (meta ``prompt_ids``, and ``rows``: the dataset rows the tool loop
        resets environments with) as Batches of ``chunk_prompts`` prompts' responses (0: one Batch)."""
        rows = prompts[PROMPT_ROWS] if PROMPT_ROWS in prompts else None
        return generate_chunks(self.generator, prompts["prompt_ids"], sampling, chunk_prompts, self.tools, rows)

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
