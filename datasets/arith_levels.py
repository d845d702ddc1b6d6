"""A generated task with difficulty levels: arithmetic problems at three levels (easy, medium, hard) for the
curriculum experiments (docs/curriculum.md). ``arith`` stays the two-number task.

Each level fixes the number of operands, their range and the operators (``LEVELS``); a problem reads like arith's,
``What is 12 + 7 * 3? Put the final answer within \\boxed{}.``, and its answer follows the usual precedence (``*``
before ``+``/``-``). Every row names its level twice: ``extra_info.level`` and ``data_source`` (``arith_<level>``,
so per-task metrics and ``data.sampler=mixture`` see the levels as tasks), and asks the math verifier for one number
(``extra_info.answer_kind = "number"``: a response that boxes the question, ``\\boxed{12 + 7 * 3}``, is otherwise
credited as its value).

Splits: ``train`` mixes the levels (``TRAIN_PER_LEVEL`` rows each, interleaved in a seeded random order); ``test``
holds ``TEST_PER_LEVEL`` distinct held-out problems of each level in round-robin order (easy, medium, hard, easy, ...:
the first N rows, ``data.val_limit=N``, hold every level about equally); ``test_<level>`` is one level's part of
``test``. A fixed fifth of each level's problem space (``held_out``: a CRC of the question) is only ever drawn for
test, so held-out accuracy measures generalisation to unseen problems. Deterministic: the rows depend only on the
split.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

GENERATED = True  # no upstream source: the lookup builds it directly


@dataclass(frozen=True)
class Level:
    """One difficulty level: ``operands`` numbers drawn uniformly from [low, high], joined by ``operators``."""

    name: str
    """The level's name (``extra_info.level``; ``data_source`` is ``arith_<name>``)."""
    operands: int
    """How many numbers a problem has (one operator fewer)."""
    low: int
    """Smallest operand."""
    high: int
    """Largest operand."""
    operators: Tuple[str, ...]
    """Operators drawn uniformly for each gap (a repeated entry is drawn more often)."""
    task: str = "arith"
    """The prefix of the rows' ``data_source`` (``arith_chain``'s levels name their task)."""

    @property
    def data_source(self) -> str:
        """The rows' ``data_source``: ``<task>_<name>`` (``arith_<name>`` here)."""
        return f"{self.task}_{self.name}"


LEVELS: Tuple[Level, ...] = (
    Level("easy", 2, 1, 30, ("+",)),                # two-number addition, as in arith
    Level("medium", 2, 10, 99, ("+", "-", "*")),    # two 2-digit numbers, a third of them multiplied
    Level("hard", 3, 10, 99, ("+", "-", "*")),      # three 2-digit numbers, mixed operators and precedence
)
"""The levels, easiest first (what SmolLM2-135M-Instruct is expected to solve of each: docs/curriculum.md)."""

TRAIN_PER_LEVEL = 1000
TEST_PER_LEVEL = 100
SEEDS = {"train": 2468, "test": 8642}
SPLITS = ("train", "test", *(f"test_{level.name}" for level in LEVELS))
"""The recipe's splits."""


def evaluate(numbers: Sequence[int], operators: Sequence[str]) -> int:
    """The value of ``numbers[0] op0 numbers[1] op1 ...`` with ``*`` before ``+`` and ``-`` (left to right)."""
    if len(operators) != len(numbers) - 1:
        raise ValueError(f"{len(numbers)} numbers need {len(numbers) - 1} operators, got {len(operators)}")
    terms, signs = [numbers[0]], [1]
    for op, x in zip(operators, numbers[1:]):
        if op == "*":
            terms[-1] *= x
        elif op in "+-":
            terms.append(x)
            signs.append(1 if op == "+" else -1)
        else:
            raise ValueError(f"unknown operator {op!r}: use + - *")
    return sum(s * t for s, t in zip(signs, terms))


def question_text(numbers: Sequence[int], operators: Sequence[str]) -> str:
    """``What is a op b ...?``"""
    parts = [str(numbers[0])]
    for op, x in zip(operators, numbers[1:]):
        parts += [op, str(x)]
    return f"What is {' '.join(parts)}?"


def held_out(question: str) -> bool:
    """Whether a problem belongs to the test part of its level's space (a fifth, fixed by the question's CRC-32)."""
    return zlib.crc32(question.encode()) % 5 == 0


def make_problem(rng: random.Random, level: Level, test: bool) -> Tuple[str, str]:
    """Draw problems of ``level`` until one falls in the split's part of the space; (question, answer)."""
    while True:
        numbers = [rng.randint(level.low, level.high) for _ in range(level.operands)]
        operators = [rng.choice(level.operators) for _ in range(level.operands - 1)]
        question = question_text(numbers, operators)
        if held_out(question) == test:
            return question, str(evaluate(numbers, operators))


def level_problems(level: Level, split: str, count: int,
                   seeds: Optional[Dict[str, int]] = None) -> List[Tuple[str, str]]:
    """``count`` problems of one level for ``split`` ("train" or "test"; test problems are distinct), drawn from
    ``seeds[split]`` (this module's ``SEEDS`` unless given). A level whose space is too small for ``count`` distinct
    held-out problems (fewer than 7 x count problems; a fifth is held out) is a ValueError naming it."""
    space = (level.high - level.low + 1) ** level.operands * len(set(level.operators)) ** (level.operands - 1)
    if split == "test" and space < 7 * count:
        raise ValueError(f"level {level.name} has {space} problems: too few for {count} distinct held-out ones "
                         f"(a fifth is held out; it needs at least {7 * count})")
    rng = random.Random(f"{(seeds or SEEDS)[split]}:{level.name}")
    out: List[Tuple[str, str]] = []
    seen = set()
    while len(out) < count:
        question, answer = make_problem(rng, level, test=split == "test")
        if split == "test" and question in seen:
            continue
        seen.add(question)
        out.append((question, answer))
    return out


def make_row(question: str, answer: str, level: Level, split: str, index: int) -> Dict:
    """One row in the data schema (docs/tasks.md), scored by the math verifier."""
    return {
        "data_source": level.data_source,
        "prompt": [{"role": "user", "content": f"{question} Put the final answer within \\boxed{{}}."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "level": level.name, "answer_kind": "number"},
        "verifier": "math",
    }


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    """The rows of ``split`` (one of ``SPLITS``); ``data_dir`` is unused (generated)."""
    if split not in SPLITS:
        raise ValueError(f"arith_levels has splits {', '.join(SPLITS)}, not {split!r}")
    return level_rows(LEVELS, split, SEEDS, TRAIN_PER_LEVEL, TEST_PER_LEVEL)


def level_rows(levels: Sequence[Level], split: str, seeds: Dict[str, int], train_per_level: int,
               test_per_level: int) -> List[Dict]:
    """The rows of ``split`` ("train", "test" or "test_<level>") for a task made of ``levels``: train mixes
    ``train_per_level`` problems of each level in a seeded order; test holds ``test_per_level`` of each, round-robin
    over the levels; test_<level> is that level's part of test, with test's indices."""
    if split == "train":
        tagged = [(q, a, level) for level in levels for q, a in level_problems(level, "train", train_per_level, seeds)]
        random.Random(seeds["train"]).shuffle(tagged)
    else:
        per_level = [[(q, a, level) for q, a in level_problems(level, "test", test_per_level, seeds)]
                     for level in levels]
        tagged = [item for group in zip(*per_level) for item in group]  # round-robin: easy, medium, hard, ...
    kind = "train" if split == "train" else "test"
    rows = [make_row(q, a, level, kind, i) for i, (q, a, level) in enumerate(tagged)]
    if split.startswith("test_"):  # one level's rows of test, with their index in test
        rows = [r for r in rows if f"test_{r['extra_info']['level']}" == split]
    return rows
