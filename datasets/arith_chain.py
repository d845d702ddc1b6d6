"""Chained arithmetic at five levels: longer and longer sums and differences of 2-digit numbers (issue 50's graded
task family, beside ``countdown``).

Why another family: on ``countdown`` SmolLM2-135M-Instruct's top levels stay at 0 because they need a search
it cannot do, and ``arith_levels`` (three levels, three numbers at most) saturated within 5 steps
(docs/curriculum.md). Here every level needs the same skill, one more addition or subtraction at a time, so a model
that learns to work a chain step by step can climb the levels; the length alone makes the top ones hard at step 0.

Each level (``LEVELS``) fixes the number of operands, all drawn from [10, 99], joined by ``+`` and ``-`` drawn
uniformly; the answer may be negative. A problem reads as arith_levels' do, ``What is 12 + 57 - 30 + 81? Put the
final answer within \\boxed{}.``, and is scored by the math verifier. Rows, splits (``train``, ``test``,
``test_l1`` .. ``test_l5``), the held-out fifth and the ``data_source`` per level (``arith_chain_<level>``) work
as in arith_levels, whose generator this module reuses with its own levels and seeds. Deterministic.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from .arith_levels import Level, level_rows

GENERATED = True  # no upstream source: the lookup builds it directly
GENERATED_FROM = ("arith_levels",)  # its rows depend on that generator too (the cache's source digest)

TASK = "arith_chain"
LEVELS = tuple(Level(f"l{i}", operands, 10, 99, ("+", "-"), task=TASK)
               for i, operands in enumerate((3, 4, 5, 6, 8), start=1))
"""The levels, shortest chain first: 3, 4, 5, 6 and 8 operands."""

TRAIN_PER_LEVEL = 1000
TEST_PER_LEVEL = 100
SEEDS = {"train": 1357, "test": 7531}
SPLITS = ("train", "test", *(f"test_{level.name}" for level in LEVELS))
"""The recipe's splits."""


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    """The rows of ``split`` (one of ``SPLITS``); ``data_dir`` is unused (generated)."""
    if split not in SPLITS:
        raise ValueError(f"{TASK} has splits {', '.join(SPLITS)}, not {split!r}")
    return level_rows(LEVELS, split, SEEDS, TRAIN_PER_LEVEL, TEST_PER_LEVEL)
