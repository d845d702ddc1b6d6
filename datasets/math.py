"""MATH recipe: MATH-500 (test) and the MATH train split -> schema rows (docs/tasks.md, data schema).

- ``test``: ``<data_dir>/math500_test.jsonl`` (openai/prm800k ``math_splits/test.jsonl``: ``problem``,
  ``solution``, ``answer``, ``subject``, ``level``, ``unique_id``).
- ``train``: ``<data_dir>/math_train.jsonl`` or ``<data_dir>/math_train.parquet`` (prm800k
  ``math_splits/train.jsonl`` or any file with ``problem`` and ``answer``/``solution``); with
  ``data_dir=None`` the Hub (``EleutherAI/hendrycks_math``, all subjects), only when online.

A pure row builder: writing parquet and the lookup order live in ``datasets/common.py``.
"""
from __future__ import annotations

from .common import read_jsonl
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from reasonrl.verifiers.math_extract import boxed_contents

INSTRUCTION = "Let's think step by step and put the final answer within \\boxed{}."
"""Appended to every problem: the math verifier reads the last ``\\boxed{}``."""
TEST_FILE = "math500_test.jsonl"
TRAIN_FILES = ("math_train.jsonl", "math_train.parquet")
HUB_REPO = "EleutherAI/hendrycks_math"
HUB_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                "prealgebra", "precalculus")
DATA_SOURCE = {"test": "math500", "train": "hendrycks_math"}


def gold_answer(example: Dict[str, Any]) -> str:
    """The example's ``answer``, or the content of the last ``\\boxed{}`` of its ``solution``."""
    answer = example.get("answer")
    if isinstance(answer, str) and answer.strip():
        return answer.strip()
    boxes = boxed_contents(str(example.get("solution") or ""))
    if not boxes or not boxes[-1]:
        raise ValueError("MATH example has neither 'answer' nor a \\boxed{} in 'solution'")
    return boxes[-1]


def _level(value: Any) -> Optional[int]:
    """``5`` or ``"Level 5"`` -> 5; None when unknown (``"Level ?"``)."""
    digits = "".join(ch for ch in str(value if value is not None else "") if ch.isdigit())
    return int(digits) if digits else None


def to_row(example: Dict[str, Any], split: str, index: int) -> Dict[str, Any]:
    """One schema row for a MATH example."""
    return {
        "data_source": DATA_SOURCE.get(split, "hendrycks_math"),
        "prompt": [{"role": "user", "content": f"{example['problem'].strip()}\n{INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gold_answer(example)},
        "extra_info": {"split": split, "index": index,
                       "subject": example.get("subject") or example.get("type") or "",
                       "level": _level(example.get("level")),
                       "unique_id": example.get("unique_id") or ""},
        "verifier": "math",
    }


def read_examples(path: Path) -> List[Dict[str, Any]]:
    """Examples from a local ``.jsonl`` or ``.parquet`` file."""
    if str(path).endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return read_jsonl(path)


def _hub_examples() -> Iterable[Dict[str, Any]]:
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        raise FileNotFoundError(
            f"the MATH train split needs {TRAIN_FILES[0]} (prm800k math_splits/train.jsonl) or "
            f"{TRAIN_FILES[1]} in REASONRL_DATA_DIR, or the Hub ({HUB_REPO}), which is offline "
            "(HF_HUB_OFFLINE=1)")
    from datasets import load_dataset  # Hugging Face datasets, only when online

    for subject in HUB_SUBJECTS:
        yield from load_dataset(HUB_REPO, subject, split="train")


def build_rows(split: str, data_dir: Optional[Path]) -> List[Dict[str, Any]]:
    """Rows for ``split`` ("test" = MATH-500, "train" = MATH train) from ``data_dir`` or the Hub."""
    if split not in DATA_SOURCE:
        raise ValueError(f"math has splits {sorted(DATA_SOURCE)}, not {split!r}")
    if split == "test":
        if data_dir is None:
            raise FileNotFoundError(f"MATH-500 is read from {TEST_FILE} in REASONRL_DATA_DIR "
                                    "(openai/prm800k math_splits/test.jsonl)")
        path = Path(data_dir) / TEST_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} not found (MATH-500: openai/prm800k math_splits/test.jsonl)")
        examples = read_examples(path)
    elif data_dir is not None:
        found = [Path(data_dir) / name for name in TRAIN_FILES if (Path(data_dir) / name).exists()]
        if not found:
            raise FileNotFoundError(f"{Path(data_dir) / TRAIN_FILES[0]} (or {TRAIN_FILES[1]}) not found: the MATH "
                                    f"train split needs prm800k math_splits/train.jsonl saved under that name")
        examples = read_examples(found[0])
    else:
        examples = list(_hub_examples())
    return [to_row(example, split, i) for i, example in enumerate(examples)]
