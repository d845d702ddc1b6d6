"""MBPP (sanitized) recipe: ``<data_dir>/mbpp_sanitized.jsonl`` -> schema rows for the code verifier.

Per the MBPP README, task_ids 11-510 are the evaluation ("test") split; 1-10 and 511-1000 are "train".
Ground truth: ``{"tests": [assert lines], "test_imports": [import lines]}``. The prompt shows the tests (as the
original MBPP prompt does) so that the model learns the function's name and signature.
"""
from __future__ import annotations

from .common import read_jsonl
import os
from pathlib import Path
from typing import Dict, List, Optional

UPSTREAM = "mbpp_sanitized.jsonl"
SPLITS = ("train", "test")
TEST_IDS = range(11, 511)
PROMPT = ("You are an expert Python programmer, and here is your task: {task}\n"
          "Your code should pass these tests:\n\n{tests}\n\n"
          "Write the complete solution as one Python program in a ```python code block.")


def split_of(task_id: int) -> str:
    """"test" for task_ids 11-510, else "train"."""
    return "test" if task_id in TEST_IDS else "train"


def to_row(example: Dict, split: str, index: int) -> Dict:
    """One upstream MBPP example -> one schema row."""
    tests = [str(t) for t in example["test_list"]]
    return {
        "data_source": "mbpp",
        "prompt": [{"role": "user", "content": PROMPT.format(task=example["prompt"].strip(), tests="\n".join(tests))}],
        "ability": "code",
        "reward_model": {"style": "rule",
                         "ground_truth": {"tests": tests, "test_imports": [str(t) for t in example.get("test_imports") or []]}},
        "extra_info": {"split": split, "index": index, "task_id": int(example["task_id"])},
        "verifier": "code",
    }


def read_upstream(data_dir: Optional[Path]) -> List[Dict]:
    """The upstream examples, in file order; FileNotFoundError when there is no file to read."""
    if data_dir is None and os.environ.get("REASONRL_DATA_DIR"):
        data_dir = Path(os.environ["REASONRL_DATA_DIR"])
    if data_dir is None:
        raise FileNotFoundError(f"MBPP needs {UPSTREAM}: pass data_dir or set REASONRL_DATA_DIR")
    return read_jsonl(Path(data_dir) / UPSTREAM)


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    """Schema rows of one split ("train" or "test"), indexed from 0 within the split."""
    if split not in SPLITS:
        raise ValueError(f"mbpp has splits {list(SPLITS)}, not {split!r}")
    chosen = [ex for ex in read_upstream(data_dir) if split_of(int(ex["task_id"])) == split]
    return [to_row(ex, split, i) for i, ex in enumerate(chosen)]
