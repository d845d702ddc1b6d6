"""The GPU step benchmark's workload as the trainer reads it: a jsonl dataset of prompts of an exact token count,
and the random-reward verifier plugin that scores the responses.

``write_prompt_dataset`` writes schema rows (``reasonrl/datasets``) whose single user message is ``prompt_len``
lowercase letters drawn from ``random.Random(seed)``; the model directory's tokenizer
(``reasonrl.bench.shapes.build_model_dir_tokenizer``: byte-level, no merges) makes each letter one token and adds
nothing, so with ``data.apply_chat_template=false`` and no system prompt each prompt is exactly ``prompt_len`` tokens
(the benchmark checks the trainer's prompts). Every row names the ``bench_random`` verifier
(``benchmarks/plugins/reasonrl_bench_reward.py``); ``use_bench_reward`` installs that plugin for this process and
those it starts.
"""
from __future__ import annotations

import json
import os
import random
import string
import sys
from pathlib import Path
from typing import List

from reasonrl.bench.records import BENCH_DIR

PLUGIN_DIR = BENCH_DIR / "plugins"
REWARD_VERIFIER = "bench_random"


def use_bench_reward() -> None:
    """Install the ``bench_random`` verifier plugin for this process and every process started from here (the
    verifier pool's, Ray's), as a user installs a plugin: ``benchmarks/plugins`` (the module and its entry point's
    dist-info) on ``sys.path`` and ``PYTHONPATH``. Call before anything reads the verifier registry."""
    path = str(PLUGIN_DIR)
    if path not in sys.path:
        sys.path.insert(0, path)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([path] + parts)


def prompt_texts(prompts: int, prompt_len: int, seed: int = 0) -> List[str]:
    """``prompts`` strings of ``prompt_len`` lowercase letters, deterministic in ``seed``."""
    if prompts < 1 or prompt_len < 1:
        raise ValueError(f"need at least one prompt of at least one token, got --prompts {prompts} x "
                         f"--prompt-len {prompt_len}")
    rng = random.Random(seed)
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(prompt_len)) for _ in range(prompts)]


def write_prompt_dataset(path: Path, prompts: int, prompt_len: int, seed: int = 0) -> Path:
    """The jsonl training file of the module docstring at ``path`` (replaced if there)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i, text in enumerate(prompt_texts(prompts, prompt_len, seed)):
            row = {"data_source": "bench", "ability": "bench", "verifier": REWARD_VERIFIER,
                   "prompt": [{"role": "user", "content": text}],
                   "reward_model": {"style": "rule", "ground_truth": "none"}, "extra_info": {"index": i}}
            f.write(json.dumps(row) + "\n")
    return path
