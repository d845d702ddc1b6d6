"""RolloutWorker: a rollout engine on its own device, and nothing else (``trainer.mode=async``).

It generates while the actor group trains, and takes new weights from actor rank 0 through the weight transfer group
(``reasonrl.workers.weight_transfer``). It counts the policy version its engine holds (the number of actor updates
its weights include) and stamps every generated row with it (meta ``weights_version``), so the trainer can measure
staleness instead of assuming it.

The generate helpers at the top are shared with the colocated ``ActorRolloutRefWorker``.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterator, List, Sequence

import torch

from reasonrl.config import from_dict
from reasonrl.data.batch import Batch
from reasonrl.models import load_tokenizer, torch_dtype
from reasonrl.rollout import SamplingParams, make_rollout_engine
from reasonrl.rollout.multiturn import ToolRollout, tool_meta

from . import weight_transfer
from .dispatch import ONE_TO_ALL, RANK_ZERO, SPLIT_BATCH, dispatch

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


def rollout_generator(engine, tokenizer, cfg):
    """What a worker generates with: the engine, or the multi-turn tool loop around it when ``tool.enabled``
    (``rollout/multiturn.py``). Both worker kinds use it, so a task with tools runs its tools in either mode."""
    return ToolRollout.from_config(engine, tokenizer, cfg) if cfg.tool.enabled else engine


def generate_chunks(generator, prompt_ids: Sequence[Sequence[int]], sampling: Dict[str, Any],
                    chunk_prompts: int, with_tools: bool = False) -> Iterator[Batch]:
    """``generator``'s (an engine's, or the tool loop's) responses to ``prompt_ids`` as consecutive Batches of
    ``chunk_prompts`` prompts' responses each (0: one Batch for all): concatenated, they equal one generate call's
    rows."""
    params = SamplingParams(**sampling)
    size = chunk_prompts if chunk_prompts > 0 else max(1, len(prompt_ids))
    for start in range(0, len(prompt_ids), size):
        part = list(prompt_ids[start:start + size])
        yield completions_to_batch(part, generator.generate(part, params), start, with_tools)


class RolloutWorker:
    """One rollout engine on one device (a GPU, or CPU cores), driven by the async trainer."""

    def __init__(self, config: Dict[str, Any], model_path: str, rank: int, world_size: int, master_addr: str = "",
                 master_port: int = 0, num_threads: int = 0) -> None:
        self.cfg = from_dict(config)
        self.rank = rank
        self.device = "cuda" if torch.cuda.is_available() and self.cfg.trainer.device != "cpu" else "cpu"
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray gives each worker one visible GPU
        elif num_threads:
            torch.set_num_threads(num_threads)
        torch.manual_seed(self.cfg.trainer.seed + 1000 * (rank + 1))
        self.tokenizer = load_tokenizer(model_path, self.cfg.model.trust_remote_code)
        self.dtype = torch_dtype(self.cfg.model.dtype, self.device)
        max_len = self.cfg.data.max_prompt_length + max(self.cfg.rollout.max_new_tokens, self.cfg.eval.max_new_tokens)
        self.engine = make_rollout_engine(self.cfg.rollout, model_path, self.tokenizer, self.dtype, self.device,
                                          max_len)
        self.generator = rollout_generator(self.engine, self.tokenizer, self.cfg)
        self.version = 0  # actor updates included in the engine's weights
        self.group = None

    def _stamped(self, batch: Batch) -> Batch:
        batch.meta["weights_version"] = [self.version] * len(batch)
        return batch

    @dispatch(SPLIT_BATCH)
    def generate(self, prompts: Batch, sampling: Dict[str, Any]) -> Batch:
        """Like ``ActorRolloutRefWorker.generate``; rows also carry ``weights_version``."""
        return self._stamped(next(generate_chunks(self.generator, prompts["prompt_ids"], sampling, 0,
                                                  self.cfg.tool.enabled)))

    def generate_stream(self, prompts: Batch, sampling: Dict[str, Any], chunk_prompts: int) -> Iterator[Batch]:
        """A Ray streaming generator (``WorkerGroup.stream``): the rows of ``generate``, a sub-batch at a time."""
        for part in generate_chunks(self.generator, prompts["prompt_ids"], sampling, chunk_prompts,
                                    self.cfg.tool.enabled):
            yield self._stamped(part)

    # ------------------------------------------------------------------ weights
    @dispatch(ONE_TO_ALL)
    def join_weight_transfer(self, host: str, port: int, group_size: int) -> None:
        """Join the transfer group as rank ``1 + self.rank`` (actor rank 0 is rank 0 and hosts the store)."""
        store = weight_transfer.connect_store(host, port)
        self.group = weight_transfer.join_group(store, 1 + self.rank, group_size, self.device,
                                                self.cfg.async_rollout.transfer_timeout_s)

    @dispatch(ONE_TO_ALL)
    def receive_weights(self, specs: List[weight_transfer.ParamSpec], version: int) -> Dict[str, float]:
        """Take the actor's weights of ``version`` from the transfer group, bucket by bucket, into the engine."""
        start = time.perf_counter()
        bucket_bytes = self.cfg.rollout.weight_sync_bucket_mb * 2**20
        moved = 0
        for bucket in weight_transfer.receive(self.group, specs, bucket_bytes, self.device):
            self.engine.update_weights(bucket)
            moved += sum(t.numel() * t.element_size() for _, t in bucket)
        self.engine.finish_weight_update()  # vLLM: close the reload session now, not at the next generate
        self.version = version
        return {"seconds": time.perf_counter() - start, "bytes": float(moved)}

    @dispatch(ONE_TO_ALL)
    def rng_state(self) -> Dict[str, Any]:
        """The random state sampling draws from (saved with an async checkpoint, after the rounds ahead)."""
        state = {"cpu": torch.get_rng_state()}
        if self.device == "cuda":
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    @dispatch(ONE_TO_ALL)
    def load_rng_state(self, states: List[Dict[str, Any]]) -> None:
        """Restore this rank's entry of ``states`` (``rng_state`` of every rank, in rank order)."""
        torch.set_rng_state(states[self.rank]["cpu"])
        if "cuda" in states[self.rank]:
            torch.cuda.set_rng_state(states[self.rank]["cuda"])

    @dispatch(ONE_TO_ALL)
    def weights_version(self) -> int:
        return self.version

    @dispatch(RANK_ZERO)
    def sequence_logprobs(self, prompts: List[List[int]], responses: List[List[int]]) -> List[List[float]]:
        """The engine's log-probs of each response given its prompt (weight checks)."""
        return self.engine.sequence_logprobs(prompts, responses)

    @dispatch(ONE_TO_ALL)
    def info(self) -> Dict[str, Any]:
        return {"rank": self.rank, "device": self.device, "engine": self.engine.name, "pid": os.getpid(),
                "threads": torch.get_num_threads(), "version": self.version}
