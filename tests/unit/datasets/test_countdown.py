"""Countdown puzzles at graded levels (datasets/countdown.py): seeded, solvable, held out, harder level by level."""
import json
import re
from fractions import Fraction

import pytest

from reasonrl.config.tasks import get_task
from reasonrl.datasets import check_row, task_files
from reasonrl.datasets import countdown as cd
from reasonrl.verifiers import get_verifier

NUMBERS = re.compile(r"Using the numbers (.+), write an arithmetic expression that equals (\d+)\.")


@pytest.fixture(scope="module")
def test_rows():
    return cd.build_rows("test")


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("countdown")


def puzzle(row):
    truth = json.loads(row["reward_model"]["ground_truth"])
    return truth["numbers"], truth["target"]


def test_reachable_by_hand():
    # {2, 3}: the numbers, 2 + 3, 2 - 3, 3 - 2, 2 * 3, 2 / 3, 3 / 2
    assert cd.reachable([2, 3], 2) == {Fraction(v) for v in (2, 3, 5, -1, 1, 6)} | {Fraction(2, 3), Fraction(3, 2)}
    assert cd.reachable([2, 3, 7], 1) == {2, 3, 7}
    # 4, 6, 9 by pairs: 10 -2 2 24 2/3 3/2 | 13 -5 5 36 4/9 9/4 | 15 -3 3 54: 19 needs all three (4 + 6 + 9)
    two = cd.reachable([4, 6, 9], 2)
    assert Fraction(24) in two and Fraction(19) not in two and Fraction(4, 3) not in two
    three = cd.reachable([4, 6, 9], 3)
    assert Fraction(19) in three and Fraction(4, 3) in three  # 4 / (9 - 6)


def test_puzzles_are_seeded(monkeypatch):
    fresh = cd.level_puzzles.__wrapped__  # past the cache: drawn again
    for level in cd.LEVELS:
        first = fresh(level, "train", 20)
        assert first == fresh(level, "train", 20) == cd.level_puzzles(level, "train", 20)
        assert first != fresh(level, "test", 20)  # the splits draw from other seeds and parts
    monkeypatch.setitem(cd.SEEDS, "train", 99)
    assert fresh(cd.LEVELS[2], "train", 20) != first_of(cd.LEVELS[2])


def first_of(level):
    return cd.level_puzzles(level, "train", 20)


def test_every_puzzle_is_solvable_and_graded(test_rows, verifier):
    by_name = {lv.name: lv for lv in cd.LEVELS}
    for row in test_rows:
        check_row(row, "countdown")
        level = by_name[row["extra_info"]["level"]]
        numbers, target = puzzle(row)
        witness = row["extra_info"]["witness"]
        # the generator's own solution is accepted by the verifier as a response
        assert verifier.verify(f"\\boxed{{{witness}}}", row["reward_model"]["ground_truth"]).correct, row
        # the row is the level's: its count of distinct numbers in range, its target in range, the question's text
        assert len(set(numbers)) == level.numbers and all(level.low <= x <= level.high for x in numbers)
        assert 1 <= target <= level.max_target
        listed, stated = NUMBERS.match(row["prompt"][0]["content"]).groups()
        assert int(stated) == target and [int(x) for x in re.findall(r"\d+", listed)] == numbers
        # the witness uses exactly `needed` of the numbers, and no smaller subset reaches the target
        assert len(re.findall(r"\d+", witness)) == level.needed
        assert Fraction(target) not in cd.reachable(numbers, level.needed - 1)
        if level.name == "l2":  # the sum of exactly two of the three numbers, and none of the three itself
            a, b, c = numbers
            assert target in (a + b, a + c, b + c) and target not in numbers


def test_levels_get_harder_as_designed():
    levels = cd.LEVELS
    assert [lv.name for lv in levels] == ["l1", "l2", "l3", "l4", "l5"]
    for easier, harder in zip(levels, levels[1:]):
        # more numbers to choose from, never fewer that every solution must combine, never fewer operators
        assert harder.numbers > easier.numbers and harder.needed >= easier.needed
        assert set(harder.operators) >= set(easier.operators)
    top = levels[-1]
    assert top.high == max(lv.high for lv in levels) and top.max_target == max(lv.max_target for lv in levels)
    assert levels[0].needed == 2 and levels[0].operators == ("+",)  # l1 is one addition
    assert (levels[1].numbers, levels[1].needed, levels[1].operators) == (3, 2, ("+",))  # l2: which pair to add
    assert levels[-1].needed >= 4 and "/" in levels[-1].operators


def test_splits_mix_hold_out_and_name_the_level(test_rows):
    names = [lv.name for lv in cd.LEVELS]
    assert [r["extra_info"]["level"] for r in test_rows[:10]] == names * 2  # round-robin
    assert len(test_rows) == cd.TEST_PER_LEVEL * len(names)
    questions = [r["prompt"][0]["content"] for r in test_rows]
    assert len(set(questions)) == len(questions)
    assert all(cd.held_out(cd.question_text(*puzzle(r))) for r in test_rows)
    assert all(r["data_source"] == f"countdown_{r['extra_info']['level']}" and r["verifier"] == "countdown"
               for r in test_rows)
    assert "\\boxed{}" in test_rows[0]["prompt"][0]["content"]
    part = cd.build_rows("test_l3")
    assert part == [r for r in test_rows if r["extra_info"]["level"] == "l3"]
    # training puzzles are never held out (a small sample of each level: the whole train split takes a while)
    for level in cd.LEVELS:
        assert not any(cd.held_out(cd.question_text(n, t)) for n, t, _ in cd.level_puzzles(level, "train", 30))


def test_task_registration_and_bad_split(tmp_path, monkeypatch):
    task = get_task("countdown")
    assert task.data_sources == tuple(lv.data_source for lv in cd.LEVELS) and task.verifier == "countdown"
    with pytest.raises(ValueError, match="countdown has splits train, test, test_l1"):
        cd.build_rows("validation")
    tiny = cd.Level("tiny", 2, 2, 1, 3, ("+",), 10)  # 6 ordered pairs, about one held out: 5 distinct cannot exist
    with pytest.raises(ValueError, match="level tiny: "):  # repeats only, or (no pair held out) no puzzle at all
        cd.level_puzzles(tiny, "test", 5)
    impossible = cd.Level("impossible", 2, 2, 1, 9, ("+",), 2)  # every sum of two distinct numbers is at least 3
    with pytest.raises(ValueError, match="level impossible: no valid training puzzle in 100000 draws"):
        cd.level_puzzles(impossible, "train", 1)
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path))
    monkeypatch.setattr(cd, "TEST_PER_LEVEL", 4)
    assert task_files("countdown", "val")[0] == str(tmp_path / "data" / "countdown" / "test.parquet")
