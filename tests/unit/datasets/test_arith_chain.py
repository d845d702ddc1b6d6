"""The chained-arithmetic task (datasets/arith_chain.py): its five levels, their answers, the held-out split, the
registration."""
import re

import pytest

from reasonrl.config.tasks import get_task, task_preset
from reasonrl.datasets import arith_chain as ac
from reasonrl.datasets import arith_levels as al
from reasonrl.datasets import check_row

NUMBERS = re.compile(r"What is (.+)\? Put the final answer within \\boxed\{\}\.$")


@pytest.fixture(scope="module")
def splits():
    return {split: ac.build_rows(split) for split in ("train", "test", "test_l5")}


def terms(row):
    tokens = NUMBERS.match(row["prompt"][0]["content"]).group(1).split()
    return [int(t) for t in tokens[::2]], tokens[1::2]


def test_answers_by_hand():
    # left to right: 28 - 72 + 61 = 17; 50 - 14 - 17 - 74 = -55 (a negative answer); 93 - 37 + 81 - 34 - 88 + 59 = 74
    assert al.evaluate([28, 72, 61], ["-", "+"]) == 17
    assert al.evaluate([50, 14, 17, 74], ["-", "-", "-"]) == -55
    assert al.evaluate([93, 37, 81, 34, 88, 59], ["-", "+", "-", "-", "+"]) == 74


def test_levels_are_longer_chains_of_two_digit_numbers(splits):
    train, test = splits["train"], splits["test"]
    for row in train[:40] + test[:40]:
        check_row(row, "arith_chain")
    assert [lv.operands for lv in ac.LEVELS] == [3, 4, 5, 6, 8]
    names = [f"l{i}" for i in range(1, 6)]
    assert [sum(r["extra_info"]["level"] == n for r in train) for n in names] == [ac.TRAIN_PER_LEVEL] * 5
    assert [r["data_source"] for r in test[:5]] == [f"arith_chain_{n}" for n in names]  # round-robin
    by_name = {lv.name: lv for lv in ac.LEVELS}
    for row in train + test:
        numbers, operators = terms(row)
        assert len(numbers) == by_name[row["extra_info"]["level"]].operands
        assert all(10 <= x <= 99 for x in numbers) and set(operators) <= {"+", "-"}
        assert row["reward_model"]["ground_truth"] == str(al.evaluate(numbers, operators))
        assert row["verifier"] == "math"
    assert any(int(r["reward_model"]["ground_truth"]) < 0 for r in test)
    questions = [r["prompt"][0]["content"] for r in test]
    assert len(set(questions)) == len(test) == 5 * ac.TEST_PER_LEVEL
    assert not set(questions) & {r["prompt"][0]["content"] for r in train}
    assert splits["test_l5"] == [r for r in test if r["extra_info"]["level"] == "l5"]
    assert questions == [r["prompt"][0]["content"] for r in ac.build_rows("test")]  # deterministic


def test_registration_and_bad_split():
    task = get_task("arith_chain")
    assert task.data_sources == tuple(lv.data_source for lv in ac.LEVELS) and task.verifier == "math"
    assert task_preset("arith_chain")["rollout"]["max_new_tokens"] == 256
    with pytest.raises(ValueError, match="arith_chain has splits train, test, test_l1, .*test_l5, not 'validation'"):
        ac.build_rows("validation")



def test_generated_arithmetic_rows_ask_for_a_number_through_the_real_pool():
    # every generated arithmetic row asks for one number, so the question boxed back scores 0 through the real
    # verifier workers, whatever the reward config says; its answer boxed scores 1
    from reasonrl.config.schema import RewardConfig
    from reasonrl.datasets import arith, arith_levels
    from reasonrl.rewards.items import verify_item
    from reasonrl.verifiers import VerifierPool

    rows = [arith.build_rows("test")[0], arith_levels.build_rows("test")[2], ac.build_rows("test")[0]]
    assert all(r["extra_info"]["answer_kind"] == "number" for r in rows)
    items = []
    for row in rows:
        expression = row["prompt"][0]["content"].split("What is ")[1].split("?")[0]  # "28 - 72 + 61"
        for response in (f"\\boxed{{{expression}}}", f"\\boxed{{{row['reward_model']['ground_truth']}}}"):
            item = verify_item(row, response, RewardConfig())
            items.append((item.verifier, item.response, item.ground_truth, item.extra))
    with VerifierPool(workers=1, timeout_s=30) as pool:
        scores = [r.score for r in pool.verify_batch(items)]
    assert scores == [0.0, 1.0] * 3
