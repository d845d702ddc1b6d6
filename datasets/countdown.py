"""Countdown puzzles at graded levels: reach a target from given numbers with ``+ - * /``, each number at most once.

The task family the curriculum experiments need (issue 50): SmolLM2-135M-Instruct saturated ``arith_levels`` in a
few steps (scored then by a math verifier that credited the question copied into the box: docs/verifiers.md); here
the upper levels need a search the model cannot do at step 0. Each level (``LEVELS``) fixes how many numbers a
puzzle gives, how many of them every solution must use at least (``needed``: the target is checked unreachable from
any smaller subset, exactly, over every expression tree, in Fraction arithmetic), the numbers' range and the
operators of the generator's own solution.

A puzzle is drawn as: distinct numbers from [low, high]; ``needed`` of them combined at random by the level's
operators (``-`` only to a positive result, ``/`` only when it divides exactly) into the *witness* expression; its
value is the target, kept when it lies in [1, max_target] and no subset of fewer than ``needed`` numbers reaches it.
The witness is kept in the row (``extra_info.witness``): every puzzle is solvable, and the verifier accepts it.

A row asks for the expression in ``\\boxed{}`` and is scored by the ``countdown`` verifier (verifiers/countdown.py);
its ground truth is the puzzle, ``{"numbers": [...], "target": N}`` as JSON text. Every row names its level twice:
``extra_info.level`` and ``data_source`` (``countdown_<level>``), so the per-level metrics, evaluation's ``by_level``
and ``data.sampler=mixture`` see the levels.

Splits as in arith_levels: ``train`` mixes the levels (``TRAIN_PER_LEVEL`` rows each, in a seeded random order);
``test`` holds ``TEST_PER_LEVEL`` distinct held-out puzzles of each level in round-robin order; ``test_<level>`` is
one level's part of ``test``. A fixed fifth of each level's puzzles (a CRC of the question) is only drawn for test.
Deterministic: the rows depend only on the split (and ``SEEDS``).
"""
from __future__ import annotations

import functools
import itertools
import json
import random
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from .arith_levels import held_out  # the same held-out fifth: a CRC-32 of the question

GENERATED = True  # no upstream source: the lookup builds it directly


@dataclass(frozen=True)
class Level:
    """One difficulty level of countdown puzzles."""

    name: str
    """The level's name (``extra_info.level``; ``data_source`` is ``countdown_<name>``)."""
    numbers: int
    """How many numbers a puzzle gives."""
    needed: int
    """How many of them the generator's solution uses; no solution uses fewer (the target is unreachable from every
    smaller subset)."""
    low: int
    """Smallest number."""
    high: int
    """Largest number."""
    operators: Tuple[str, ...]
    """Operators the generator's solution is built from (the response may use all four)."""
    max_target: int
    """Largest target."""

    @property
    def data_source(self) -> str:
        """The rows' ``data_source``: ``countdown_<name>``."""
        return f"countdown_{self.name}"


LEVELS: Tuple[Level, ...] = (
    Level("l1", 2, 2, 1, 50, ("+",), 100),                     # a + b: the format, one addition
    Level("l2", 3, 2, 1, 50, ("+",), 100),                     # pick the two of three that add up
    Level("l3", 4, 2, 1, 30, ("+", "-", "*"), 200),            # pick two of four, one operation
    Level("l4", 5, 3, 1, 30, ("+", "-", "*"), 300),            # three of five, two operations
    Level("l5", 6, 4, 2, 100, ("+", "-", "*", "/"), 999),      # four of six larger numbers, three operations
)
"""The levels, easiest first (the base model's accuracy on each: docs/tasks.md, benchmarks/graded_task_base.py).
The first set (l2 two of three with ``+ - *``, l3 three of four, l4 four of five with ``/``) left the base model 0
of 192 samples on l2, a cliff after l1 (0.32): l2 is now an addition of the right pair, and each level above it
the next step of the old ladder (benchmarks/results/countdown_base_levels_v1.json)."""

TRAIN_PER_LEVEL = 1000
TEST_PER_LEVEL = 100
SEEDS = {"train": 1357, "test": 7531}
MAX_DRAWS = 100_000
"""Draws of one puzzle before a level counts as having none (a level whose constraints nothing meets)."""
MAX_REPEATS = 1000
"""Held-out puzzles drawn again in a row before a level's space counts as too small for its test count."""
SPLITS = ("train", "test", *(f"test_{level.name}" for level in LEVELS))
"""The recipe's splits."""


def reachable(numbers: Sequence[int], max_size: int) -> FrozenSet[Fraction]:
    """Every value an expression over at most ``max_size`` of ``numbers`` (each used at most once) can take, with
    ``+ - * /`` and any parenthesisation, in exact Fraction arithmetic (division by zero left out)."""
    values: Dict[FrozenSet[int], set] = {frozenset([i]): {Fraction(x)} for i, x in enumerate(numbers)}
    for size in range(2, max_size + 1):
        for subset in map(frozenset, itertools.combinations(range(len(numbers)), size)):
            out: set = set()
            members = sorted(subset)
            for k in range(1, size // 2 + 1):  # each unordered split {A, B} once
                for part in itertools.combinations(members, k):
                    left = frozenset(part)
                    right = subset - left
                    if k * 2 == size and min(right) < min(left):
                        continue
                    for a in values[left]:
                        for b in values[right]:
                            out.update((a + b, a - b, b - a, a * b))
                            if b:
                                out.add(a / b)
                            if a:
                                out.add(b / a)
            values[subset] = out
    return frozenset().union(*values.values())


def build_witness(rng: random.Random, chosen: List[int], operators: Sequence[str]) -> Optional[Tuple[str, int]]:
    """Combine ``chosen`` at random into one expression (``-`` to a positive value, ``/`` exactly); (text, value),
    or None when no operator fits some drawn pair."""
    items = [(str(x), x) for x in chosen]
    while len(items) > 1:
        (ta, a), (tb, b) = items.pop(rng.randrange(len(items))), items.pop(rng.randrange(len(items)))
        if a < b:
            (ta, a), (tb, b) = (tb, b), (ta, a)
        fits = [op for op in operators if op in "+*" or (op == "-" and a > b) or (op == "/" and b > 1 and a % b == 0)]
        if not fits:
            return None
        op = rng.choice(fits)
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        items.append((f"({ta} {op} {tb})", value))
    text, value = items[0]
    return (text[1:-1] if len(chosen) > 1 else text), value  # the outermost parentheses wrap the whole


def question_text(numbers: Sequence[int], target: int) -> str:
    """The puzzle as the prompt states it."""
    listed = ", ".join(str(x) for x in numbers[:-1]) + f" and {numbers[-1]}"
    return (f"Using the numbers {listed}, write an arithmetic expression that equals {target}. You may use +, -, *, / "
            f"and parentheses; use each number at most once (you need not use all of them).")


def make_puzzle(rng: random.Random, level: Level, test: bool) -> Tuple[List[int], int, str]:
    """Draw puzzles of ``level`` until one is valid and in the split's part of the space; (numbers, target,
    witness). A ValueError naming the level after ``MAX_DRAWS`` draws without one."""
    for _ in range(MAX_DRAWS):
        numbers = rng.sample(range(level.low, level.high + 1), level.numbers)
        witness = build_witness(rng, rng.sample(numbers, level.needed), level.operators)
        if witness is None or not 1 <= witness[1] <= level.max_target:
            continue
        text, target = witness
        if held_out(question_text(numbers, target)) != test:
            continue
        if Fraction(target) in reachable(numbers, level.needed - 1):
            continue
        return numbers, target, text
    raise ValueError(f"level {level.name}: no valid {'held-out' if test else 'training'} puzzle in {MAX_DRAWS} draws")


def make_row(numbers: Sequence[int], target: int, witness: str, level: Level, split: str, index: int) -> Dict:
    """One row in the data schema (docs/tasks.md), scored by the countdown verifier."""
    prompt = f"{question_text(numbers, target)} Put the final expression within \\boxed{{}}."
    return {
        "data_source": level.data_source,
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": json.dumps({"numbers": list(numbers), "target": target})},
        "extra_info": {"split": split, "index": index, "level": level.name, "witness": witness},
        "verifier": "countdown",
    }


@functools.lru_cache(maxsize=64)
def level_puzzles(level: Level, split: str, count: int) -> Tuple[Tuple[Tuple[int, ...], int, str], ...]:
    """``count`` puzzles of one level for ``split`` ("train" or "test"; test puzzles are distinct): (numbers,
    target, witness) each. Cached: the exact reachability check costs about 7 ms a puzzle at l5."""
    rng = random.Random(f"{SEEDS[split]}:{level.name}")
    out: List[Tuple[Tuple[int, ...], int, str]] = []
    seen = set()
    repeats = 0
    while len(out) < count:
        numbers, target, witness = make_puzzle(rng, level, test=split == "test")
        key = question_text(numbers, target)
        if split == "test" and key in seen:
            repeats += 1
            if repeats > MAX_REPEATS:
                raise ValueError(f"level {level.name}: {MAX_REPEATS} held-out puzzles in a row were repeats after "
                                 f"{len(out)} distinct ones; its space is too small for {count}")
            continue
        repeats = 0
        seen.add(key)
        out.append((tuple(numbers), target, witness))
    return tuple(out)


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    """The rows of ``split`` (one of ``SPLITS``); ``data_dir`` is unused (generated)."""
    if split not in SPLITS:
        raise ValueError(f"countdown has splits {', '.join(SPLITS)}, not {split!r}")
    if split == "train":
        tagged = [(*p, level) for level in LEVELS for p in level_puzzles(level, "train", TRAIN_PER_LEVEL)]
        random.Random(SEEDS["train"]).shuffle(tagged)
    else:
        per_level = [[(*p, level) for p in level_puzzles(level, "test", TEST_PER_LEVEL)] for level in LEVELS]
        tagged = [item for group in zip(*per_level) for item in group]  # round-robin: l1, l2, ..., l1, ...
    kind = "train" if split == "train" else "test"
    rows = [make_row(n, t, w, level, kind, i) for i, (n, t, w, level) in enumerate(tagged)]
    if split.startswith("test_"):  # one level's rows of test, with their index in test
        rows = [r for r in rows if f"test_{r['extra_info']['level']}" == split]
    return rows
