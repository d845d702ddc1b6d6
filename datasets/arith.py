"""A generated task: two-number arithmetic with a boxed answer. Small enough that a 135M model partly solves it,
so learning is visible within a CPU budget. Deterministic: the rows depend only on the split.

The whole space is small (30 x 30 operands x 2 operations = 1,800 problems), so the splits partition it: a fixed
fifth of the problems (``held_out``) is only ever drawn for test, and test rows are distinct. Held-out accuracy then
measures generalisation to unseen problems, not recall of training prompts.

Every row asks the math verifier for one number (``extra_info.answer_kind = "number"``): the question is the
expression, so without it a response that boxes the question (``\\boxed{12 + 7}``) is credited as its value."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Dict, List, Optional

GENERATED = True  # no upstream source: the lookup builds it directly
SIZES = {"train": 2000, "test": 300}
SEEDS = {"train": 1234, "test": 4321}


def held_out(a: int, b: int, op: str) -> bool:
    """Whether a problem belongs to the test part of the space (360 of the 1,800 problems)."""
    return ((a * 31 + b) * 2 + (op == "-")) % 5 == 0


def make_problem(rng: random.Random, test: bool):
    """Draw problems until one falls in the split's part of the space; (question, answer)."""
    while True:
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        op = rng.choice(["+", "-", "+"])
        if held_out(a, b, op) == test:
            answer = a + b if op == "+" else a - b
            return f"What is {a} {op} {b}?", str(answer)


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    if split not in SIZES:
        raise ValueError(f"arith has splits {sorted(SIZES)}, not {split!r}")
    rng = random.Random(SEEDS[split])
    rows, questions = [], set()
    while len(rows) < SIZES[split]:
        question, answer = make_problem(rng, test=split == "test")
        if split == "test" and question in questions:
            continue  # distinct held-out problems
        questions.add(question)
        i = len(rows)
        rows.append({
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"{question} Put the final answer within \\boxed{{}}."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": i, "answer_kind": "number"},
            "verifier": "math",
        })
    return rows
