"""GSM8K recipe: upstream jsonl (question, answer with '#### <number>') -> schema rows."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from .common import read_jsonl

INSTRUCTION = "Let's think step by step and put the final answer within \\boxed{}."
UPSTREAM = {"train": "gsm8k_train.jsonl", "test": "gsm8k_test.jsonl"}


def gold_answer(solution: str) -> str:
    """The text after the last '####' of a GSM8K solution, thousands separators removed ('1,000' -> '1000')."""
    if "####" not in solution:
        raise ValueError("GSM8K solution has no '####' line")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def to_row(example: Dict, split: str, index: int) -> Dict:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{example['question'].strip()}\n{INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gold_answer(example["answer"])},
        "extra_info": {"split": split, "index": index, "question": example["question"]},
        "verifier": "math",
    }


def build_rows(split: str, data_dir: Optional[Path]) -> List[Dict]:
    if split not in UPSTREAM:
        raise ValueError(f"gsm8k has splits {sorted(UPSTREAM)}, not {split!r}")
    if data_dir is not None:
        examples = read_jsonl(Path(data_dir) / UPSTREAM[split])
    else:
        from datasets import load_dataset  # Hugging Face datasets, only when online

        examples = list(load_dataset("openai/gsm8k", "main", split=split))
    return [to_row(ex, split, i) for i, ex in enumerate(examples)]
