"""benchmarks/tool_answer_kinds.py: each kind of answer on a hand-written trajectory, and the changes between two
validations counted by hand."""
from __future__ import annotations

import pytest
from helpers import benchmark_module

EXAMPLES = ("system\nAnswer with the search tool.\nuser\nIn what year was Zorbel Quintax born?\nassistant\n"
            "<tool_call>...</tool_call>\ntool\n1. Zorbel Quintax: born in the year 1834.\nassistant\n\\boxed{1834}.\n")


@pytest.fixture(scope="module")
def kinds():
    return benchmark_module("tool_answer_kinds")


def row(q, conversation, correct=False, step=0, finish="stop"):
    return {"step": step, "prompt": EXAMPLES + f"user\n{q}\nassistant\n", "conversation": conversation,
            "correct": correct, "response": "", "ground_truth": "1873", "finish_reason": finish}


TWO_HOP = "In what year was the city where Veorn Zelsilcal was born founded?"
BORN = "In what year was Veorn Zelsilcal born?"
HITS = ("[assistant]\n<tool_call>{}</tool_call>\n[tool]\n"
        "1. Veorn Zelsilcal: Veorn Zelsilcal is a weaver, born in the year 1873 in the city of Istgafen.\n"
        "2. Veorn Vemarnox: Veorn Vemarnox is a astronomer, born in the year 1930 in the city of Istdordor.\n")


def test_each_kind_of_answer(kinds):
    assert kinds.question(EXAMPLES + f"user\n{BORN}\nassistant\n") == BORN  # the last user turn, not the example's
    assert kinds.answer_kind(row(BORN, HITS + "[assistant]\n\\boxed{1873}", correct=True)) == "right"
    assert kinds.answer_kind(row(BORN, "[assistant]\nHe was born in 1873.")) == "no_call"
    assert kinds.answer_kind(row(BORN, HITS + "[assistant]\nI do not know.")) == "no_answer"
    # the second article's year: a distractor; boxed wins over a later number
    assert kinds.answer_kind(row(BORN, HITS + "[assistant]\nIt is \\boxed{1930}, not 1873.")) == "distractor"
    assert kinds.answer_kind(row(BORN, HITS + "[assistant]\nThe year is 1701.")) == "not_in_tool"
    # two-hop after one search, answering the person's birth year: one hop short
    assert kinds.answer_kind(row(TWO_HOP, HITS + "[assistant]\nIt was founded in \\boxed{1873}.")) == "one_hop"
    # two-hop with a second search that returned the city: a wrong year from it is a distractor, not one hop
    second = HITS + "[assistant]\n<tool_call>{}</tool_call>\n[tool]\n1. Istgafen: founded in the year 1302.\n"
    assert kinds.answer_kind(row(TWO_HOP, second + "[assistant]\n\\boxed{1873}")) == "distractor"
    assert kinds.question_type(TWO_HOP) == "two_hop"
    assert kinds.question_type("In what year was the city of Istgafen founded?") == "founded"


def test_changes_between_validations(kinds):
    questions = [f"In what year was Person{i} born?" for i in range(4)]
    right = HITS + "[assistant]\n\\boxed{1873}"
    wrong = HITS + "[assistant]\n\\boxed{1930}"
    rows = [row(questions[0], right, True, 0), row(questions[0], wrong, False, 8),   # right -> wrong
            row(questions[1], wrong, False, 0), row(questions[1], right, True, 8),   # wrong -> right
            row(questions[2], right, True, 0), row(questions[2], right, True, 8),    # unchanged
            row(questions[3], wrong, False, 0), row(questions[3], "[assistant]\n1930", False, 8, "length")]
    out = kinds.summarize(rows)
    assert out["steps"] == [0, 8] and out["questions"] == 4
    assert out["per_step"]["0"]["all"]["right"] == 2 and out["per_step"]["0"]["born"]["distractor"] == 2
    change = out["changes"]["0->8"]
    assert (change["right_to_wrong"], change["wrong_to_right"]) == (1, 1)
    assert change["moves"] == {"right -> distractor": 1, "distractor -> right": 1, "distractor -> no_call": 1}
    # step 0: all four boxed, the true 1873 in the last message of q0 and q2; step 8: q3's bare "1930" unboxed and
    # cut by the length cap, 1873 last in q1 and q2
    assert out["form"]["0"] == {"answers": 4, "boxed": 4, "length_capped": 0, "truth_in_last_message": 2}
    assert out["form"]["8"] == {"answers": 4, "boxed": 3, "length_capped": 1, "truth_in_last_message": 2}
