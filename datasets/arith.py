"""A generated task: two-number arithmetic with a boxed answer. Small enough that a 135M model partly solves it,
so learning is visible within a CPU budget. Deterministic: the rows depend only on the split."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Dict, List, Optional

GENERATED = True  # no upstream source: the lookup builds it directly
SIZES = {"train": 2000, "test": 200}
SEEDS = {"train": 1234, "test": 4321}


def make_problem(rng: random.Random):
    a, b = rng.randint(1, 30), rng.randint(1, 30)
    op = rng.choice(["+", "-", "+"])
    answer = a + b if op == "+" else a - b
    return f"What is {a} {op} {b}?", str(answer)


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    if split not in SIZES:
        raise ValueError(f"arith has splits {sorted(SIZES)}, not {split!r}")
    rng = random.Random(SEEDS[split])
    rows = []
    for i in range(SIZES[split]):
        question, answer = make_problem(rng)
        rows.append({
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"{question} Put the final answer within \\boxed{{}}."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": i},
            "verifier": "math",
        })
    return rows
