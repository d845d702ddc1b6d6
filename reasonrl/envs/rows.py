"""Dataset rows by their prompt's tokens, for a loop that is handed token ids only.

The workers' ``generate`` receives the prompts' token ids, not their rows. ``PromptRows`` renders the rows of the
run's data files (train and validation, as ``task_files`` finds them) the way the trainer does (``render_prompt``
with ``data.system_prompt`` and ``data.apply_chat_template``) and keys the rows that name an environment by those
tokens; a prompt it does not know gets ``{}`` (the run's default environment). Built on first use, once per loop.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

log = logging.getLogger(__name__)


class PromptRows:
    """``rows(prompt_token_ids)`` -> the dataset row of each prompt that names an environment, else ``{}``."""

    def __init__(self, cfg: Any, tokenizer: Any) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self._index: Optional[Dict[Tuple[int, ...], Dict[str, Any]]] = None

    def index(self) -> Dict[Tuple[int, ...], Dict[str, Any]]:
        if self._index is None:
            from reasonrl.data.prompts import render_prompt
            from reasonrl.datasets import DataError, read_rows, task_files

            cfg, index = self.cfg, {}
            for which, explicit in (("train", cfg.data.train_files), ("val", cfg.data.val_files)):
                try:
                    files = task_files(cfg.task, which, explicit)
                except (DataError, FileNotFoundError, ValueError) as exc:
                    log.warning("environment rows: no %s files (%s)", which, exc)
                    continue
                for f in files:
                    for row in read_rows(f):
                        if row.get("environment"):
                            ids = render_prompt(self.tokenizer, row["prompt"], cfg.data.apply_chat_template,
                                                cfg.data.system_prompt)
                            index[tuple(ids)] = row
            self._index = index
        return self._index

    def __call__(self, prompt_token_ids: List[List[int]]) -> List[Dict[str, Any]]:
        index = self.index()
        return [index.get(tuple(p), {}) for p in prompt_token_ids]
