"""The generated task with difficulty levels (datasets/arith_levels.py): levels, held-out splits, the answers."""
import re

import pytest

from reasonrl.config.tasks import get_task
from reasonrl.data.prompts import Prompt
from reasonrl.data.sample import Round, Sample
from reasonrl.datasets import arith_levels as al
from reasonrl.datasets import check_row, task_files

NUMBERS = re.compile(r"What is (.+)\?")


def question(row):
    return row["prompt"][0]["content"].split(" Put the final")[0]


@pytest.fixture(scope="module")
def splits():
    return {split: al.build_rows(split) for split in al.SPLITS}


def test_precedence_by_hand():
    # 12 + 7 * 3 = 12 + 21 = 33; 50 - 4 * 5 - 6 = 50 - 20 - 6 = 24; 3 * 4 * 5 = 60; 10 - 3 + 2 = 9 (left to right)
    assert al.evaluate([12, 7, 3], ["+", "*"]) == 33
    assert al.evaluate([50, 4, 5, 6], ["-", "*", "-"]) == 24
    assert al.evaluate([3, 4, 5], ["*", "*"]) == 60
    assert al.evaluate([10, 3, 2], ["-", "+"]) == 9
    with pytest.raises(ValueError, match="unknown operator '/'"):
        al.evaluate([1, 2], ["/"])
    with pytest.raises(ValueError, match="3 numbers need 2 operators"):
        al.evaluate([1, 2, 3], ["+"])


def test_levels_mix_in_train_and_are_held_out(splits):
    train, test = splits["train"], splits["test"]
    for row in train[:50] + test[:50]:
        check_row(row, "arith_levels")
    levels = [lv.name for lv in al.LEVELS]
    assert [sum(r["extra_info"]["level"] == name for r in train) for name in levels] == [al.TRAIN_PER_LEVEL] * 3
    assert {r["data_source"] for r in train} == {"arith_easy", "arith_medium", "arith_hard"}
    assert all(r["data_source"] == f"arith_{r['extra_info']['level']}" for r in train + test)
    # mixed, not in blocks: the first 30 training rows already hold every level
    assert {r["extra_info"]["level"] for r in train[:30]} == set(levels)
    # test: round-robin easy, medium, hard; distinct; never a training problem; every one in the held-out fifth
    assert [r["extra_info"]["level"] for r in test[:6]] == levels * 2
    assert len({question(r) for r in test}) == len(test) == 3 * al.TEST_PER_LEVEL
    assert not {question(r) for r in train} & {question(r) for r in test}
    assert all(al.held_out(question(r)) for r in test) and not any(al.held_out(question(r)) for r in train)
    # per-level test files are test's rows of that level, with test's indices
    for name in levels:
        part = splits[f"test_{name}"]
        assert part == [r for r in test if r["extra_info"]["level"] == name] and len(part) == al.TEST_PER_LEVEL
    assert [question(r) for r in test] == [question(r) for r in al.build_rows("test")]  # deterministic


def test_rows_match_their_level_and_answer(splits):
    by_name = {lv.name: lv for lv in al.LEVELS}
    for row in splits["train"] + splits["test"]:
        level = by_name[row["extra_info"]["level"]]
        tokens = NUMBERS.match(question(row)).group(1).split()
        numbers, operators = [int(t) for t in tokens[::2]], tokens[1::2]
        assert len(numbers) == level.operands and set(operators) <= set(level.operators)
        assert all(level.low <= x <= level.high for x in numbers)
        assert row["reward_model"]["ground_truth"] == str(al.evaluate(numbers, operators))
    # the levels are harder in the way they say: hard rows have three operands, easy ones are additions
    assert {len(NUMBERS.match(question(r)).group(1).split()) for r in splits["test_hard"]} == {5}
    assert all("+" in question(r) and "-" not in question(r) for r in splits["test_easy"])


def test_task_registration_and_bad_split(tmp_path, monkeypatch):
    task = get_task("arith_levels")
    assert task.data_sources == tuple(lv.data_source for lv in al.LEVELS) and task.verifier == "math"
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="arith_levels has splits train, test, test_easy, test_medium, test_hard"):
        al.build_rows("validation")
    too_small = al.Level("tiny", 2, 1, 3, ("+",))  # 9 problems, about 2 held out: 5 distinct test ones cannot exist
    with pytest.raises(ValueError, match="level tiny has 9 problems"):
        al.level_problems(too_small, "test", 5)
    assert task_files("arith_levels", "val")[0].endswith("test.parquet")


def level_round(rows, results, n=2):
    """A round of ``rows`` (one prompt each), ``results`` ``n`` per row in row order."""
    samples = [Sample(group=i // n, response_ids=[], response_text="", rollout_log_probs=[], finish_reason="stop",
                      result=r) for i, r in enumerate(results)]
    return Round([Prompt([], row) for row in rows], samples)


def test_level_metrics_of_a_round_and_a_validation(splits):
    """The trainer's mix metrics (``levels/*``, ``val/<level>/accuracy``), on real rows and real math verdicts."""
    from reasonrl.trainer import metrics as curriculum
    from reasonrl.verifiers import VerifyResult, get_verifier

    levels = curriculum.data_levels(splits["train"])
    assert levels == ["easy", "hard", "medium"]

    easy, medium, hard = splits["test"][:3]  # round-robin: one row of each level
    math = get_verifier("math")

    def verdict(row, right):
        truth = row["reward_model"]["ground_truth"]
        return math.verify(f"\\boxed{{{truth if right else int(truth) + 1}}}", truth)

    # groups of n = 2: easy passes twice (uninformative), medium once (informative), hard once with its other
    # response failed (no verdict: one judged response, uninformative). Informative groups 1/3; shares 1/3 each;
    # training accuracy over the verdicts: easy 2/2, medium 1/2, hard 1/1.
    rows = [easy, medium, hard]
    results = [verdict(easy, True), verdict(easy, True), verdict(medium, True), verdict(medium, False),
               verdict(hard, True), VerifyResult.failure("timeout")]
    assert [r.correct for r in results[:5]] == [True, True, True, False, True]
    m = curriculum.round_level_metrics(level_round(rows, results), levels)
    assert m["levels/responses"] == 6.0 and m["levels/informative_groups"] == pytest.approx(1 / 3)
    assert [m[f"levels/share/{lv}"] for lv in ("easy", "medium", "hard")] == [pytest.approx(1 / 3)] * 3
    assert [m[f"levels/train_accuracy/{lv}"] for lv in ("easy", "medium", "hard")] == [1.0, 0.5, 1.0]
    # a round of easy rows only: the other levels are there with share 0 and no accuracy
    only_easy = curriculum.round_level_metrics(level_round([easy], results[:2]), levels)
    assert only_easy["levels/share/hard"] == 0.0 and "levels/train_accuracy/hard" not in only_easy
    with pytest.raises(ValueError, match="group 2 in a round of 2 prompts"):
        curriculum.round_level_metrics(level_round(rows[:2], results[:5]), levels)
    # validation: one response per row; easy right, medium wrong, hard failed (left out: no accuracy)
    v = curriculum.val_level_metrics(rows, [verdict(easy, True), verdict(medium, False),
                                            VerifyResult.failure("timeout")])
    assert v == {"val/easy/accuracy": 1.0, "val/medium/accuracy": 0.0}
    assert curriculum.data_levels([easy, easy]) == [] and curriculum.val_level_metrics([easy], results[:1]) == {}
