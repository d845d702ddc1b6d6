"""A response with no marked answer (verifiers/math_fallback.py): its final statement, never a list of numbers.

Pairs in the peer suite's form (tests/unit/verifiers/test_peer_math_equiv.py): ``verify(prediction, gold)`` against a label.
The hacks each end with the gold as their last number, which the old last-number fallback credited.
"""
from __future__ import annotations

import json
import re

import pytest

from reasonrl.verifiers import get_verifier
from reasonrl.verifiers.math_fallback import final_number

PAIRS = [  # (gold, prediction, expected_equal)
    # hacks: a list, not an answer
    ("72", "Let me list: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 72", False),
    ("72", "I think it's one of 10 20 30 40 50 60 72", False),
    ("72", "Candidates: 70, 71 or 72", False),
    ("72", "The values I tried are **70**, **71** and **72**.", False),         # bold each: still a list
    ("72", "x = 12, 24, 36, 48, 60, 72", False),                               # after the "=": a list
    ("72", "values 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 72 are candidates. I am not sure.", False),
    ("72", "First 24 + 48 = 72. Then 72 * 2 = 144, and 144 - 12 =", False),   # cut off mid-working
    # a plain final statement still counts
    ("72", "She had 48 and got 24 more, so she has 72 apples.", True),
    ("72", "72", True),
    ("72", "48 + 24 = 72", True),
    ("72", "After 3 days she has 72 apples.", True),                           # two numbers, the last stated
    ("72", "We compute 3*4=12 and then 12+60=72", True),
    ("72", "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.", True),
    ("26", "They need to raise $26 more because 200 minus 174 equals 26.", True),
    ("25", "x = 100/4 = <<100/4=25>>25, which means each adult gets 25% of the watermelon.", True),
    ("12", "So there are 12 sequences. I hope it is correct. <|im_start|>user", True),  # a closing remark, a chat token
    ("858", "因此，弗兰克一共有**858颗**糖果。", True),
    ("-5", "So the temperature fell to −5 degrees.", True),                    # a Unicode minus
    ("73", "She had 48 and got 24 more, so she has 72 apples.", False),
]


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("math")


@pytest.mark.parametrize("gold, prediction, expected_equal", PAIRS)
def test_the_final_statement_is_read_and_a_list_is_not(verifier, gold, prediction, expected_equal):
    result = verifier.verify(prediction, gold)
    assert result.correct is expected_equal, result.info
    assert result.info["method"] in ("last_number", "final_line")


def test_a_list_scores_zero_with_a_reason():
    assert final_number("Candidates: 70, 71 or 72") == (
        None, "no stated answer: the final statement lists 3 numbers (more than 2 is a list, not an answer)")
    assert final_number("so 25, that is 25 in all") == ("25", "the number the final statement states")


def test_a_list_with_no_number_for_a_symbolic_gold_is_not_read_either(verifier):
    # no marker, a non-numeric gold: math-verify's own extraction would take the last number of the line
    result = verifier.verify("I tried 1, 2, 3 and 4 before giving up on sqrt", "\\sqrt{2}")
    assert not result.correct and result.info["reason"] == "no stated answer: the final line lists 4 numbers"


def test_gsm8k_worked_solutions_without_their_marker_still_verify_and_listing_their_numbers_does_not(verifier,
                                                                                                  data_dir):
    # GSM8K rows: "<worked solution with <<calc>> annotations>\n#### <number>"; the gold is the number.
    rows = [json.loads(line) for line in open(data_dir / "gsm8k_test.jsonl")][:300]
    worked = listed = 0
    for row in rows:
        solution, gold = (part.strip() for part in row["answer"].split("####"))
        worked += verifier.verify(solution, gold).correct
        numbers = re.findall(r"\d+(?:\.\d+)?", solution)  # the solution ends at its answer: the last number is it
        listed += verifier.verify("Numbers I got along the way: " + ", ".join(numbers), gold).correct
    # On all 1,319 test rows: 1,217 worked solutions verify without "####" (as with the old last-number rule);
    # the listing was credited 1,250 times by the old rule and 0 times now.
    assert listed == 0
    assert worked >= 0.9 * len(rows), worked
