"""Prompt datasets: schema rows -> chat-template token ids (with the tools of the row's environment), and a
resumable epoch sampler."""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from reasonrl.datasets import DataError, read_rows

log = logging.getLogger(__name__)


def render_prompt(tokenizer, messages: List[Dict[str, str]], apply_chat_template: bool = True,
                  system_prompt: Optional[str] = None, tools: Optional[List[Dict[str, Any]]] = None) -> List[int]:
    """Token ids of a prompt: the tokenizer's chat template with the generation prompt appended. ``tools``: the JSON
    schemas the prompt offers (``reasonrl.envs.prompting.row_tools``), given to the template (``tools=``) when it
    reads them, else described in the system message (``offer_tools`` decides)."""
    from reasonrl.envs.prompting import offer_tools

    if system_prompt:
        messages = [{"role": "system", "content": system_prompt}] + [m for m in messages if m["role"] != "system"]
    use_template = bool(apply_chat_template and getattr(tokenizer, "chat_template", None))
    messages, template_tools = offer_tools(tokenizer, messages, tools or [], use_template)
    if use_template:
        extra = {"tools": template_tools} if template_tools else {}
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **extra)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return list(ids)
    text = "\n".join(m["content"] for m in messages)
    return tokenizer(text, add_special_tokens=True)["input_ids"]


@dataclass
class Prompt:
    """One prompt ready for rollout."""

    token_ids: List[int]
    row: Dict[str, Any]


class PromptDataset:
    """Rows from parquet files, rendered to token ids; prompts longer than ``max_prompt_length`` are dropped."""

    def __init__(self, files: Sequence[str], tokenizer, max_prompt_length: int, apply_chat_template: bool = True,
                 system_prompt: Optional[str] = None, limit: int = 0) -> None:
        rows: List[Dict[str, Any]] = []
        for f in files:
            rows.extend(read_rows(f))
        if not rows:
            raise DataError(f"{', '.join(map(str, files)) or 'no files'}: no rows (the data files are empty)")
        if limit:
            rows = rows[:limit]
        self.prompts: List[Prompt] = []
        dropped = 0
        from reasonrl.envs.prompting import row_tools

        for row in rows:  # a row naming a hermes environment offers its tools (reasonrl/envs/prompting.py)
            ids = render_prompt(tokenizer, row["prompt"], apply_chat_template, system_prompt, row_tools(row))
            if len(ids) > max_prompt_length:
                dropped += 1
                continue
            self.prompts.append(Prompt(ids, row))
        if dropped:
            log.warning("dropped %d prompts longer than %d tokens", dropped, max_prompt_length)
        if not self.prompts:
            raise DataError(f"all {len(rows)} prompts in {', '.join(map(str, files))} are longer than "
                            f"data.max_prompt_length={max_prompt_length} tokens")
        self.dropped = dropped

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> Prompt:
        return self.prompts[i]


class EpochSampler:
    """``data.sampler=uniform``: yields batches of indices, reshuffled each epoch with ``seed + epoch`` (every prompt
    once per epoch; the tail that does not fill a batch is dropped); its state is (epoch, offset). ``last_indices``
    is the batch drawn last (the curriculum metrics read it)."""

    def __init__(self, size: int, batch_size: int, seed: int, shuffle: bool = True) -> None:
        if batch_size > size:
            raise DataError(f"data.train_batch_size={batch_size} exceeds the {size} prompts available")
        self.size, self.batch_size, self.seed, self.shuffle = size, batch_size, seed, shuffle
        self.epoch, self.offset = 0, 0
        self.last_indices: List[int] = []

    def _order(self, epoch: int) -> List[int]:
        order = list(range(self.size))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def next_indices(self) -> List[int]:
        if self.offset + self.batch_size > self.size:  # drop the tail: every batch is full
            self.epoch, self.offset = self.epoch + 1, 0
        batch = self._order(self.epoch)[self.offset:self.offset + self.batch_size]
        self.offset += self.batch_size
        self.last_indices = list(batch)
        return batch

    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
