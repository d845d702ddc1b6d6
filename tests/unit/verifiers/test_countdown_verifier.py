"""The countdown verifier (verifiers/countdown.py): exact verdicts on hand-written responses, never eval()."""
import json

import pytest

from reasonrl.verifiers import get_verifier

PUZZLE = json.dumps({"numbers": [3, 7, 25, 8], "target": 53})
"""By hand: 7 * 8 - 3 = 56 - 3 = 53 uses three of the four numbers (25 unused, which is allowed)."""


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("countdown")


def verdict(verifier, response, truth=PUZZLE):
    return verifier.verify(response, truth)


@pytest.mark.parametrize("response", [
    "7 * 8 = 56, 56 - 3 = 53. So \\boxed{7 * 8 - 3}",
    "\\boxed{(7 \\times 8) - 3}",                           # LaTeX times
    "\\boxed{7 \u00d7 8 - 3 = 53}",                           # Unicode times, "= target" after it
    "\\boxed{53 = \\left(7 \\cdot 8\\right) - 3}",          # target first, \\left( \\right)
    "\\boxed{$8 \\cdot 7 - 3$}",                              # inline math dollars
    "First \\boxed{7 + 8}, then the answer: \\boxed{8 * 7 - 3}",   # the last box is read
    "7 * 8 = 56\n**7 * 8 - 3 = 53**.",                        # no box: the final line, when it is only the expression
])
def test_right_answers_and_their_spellings(verifier, response):
    result = verdict(verifier, response)
    assert result.correct and result.score == 1.0 and result.info["reason"] == "correct"


def test_fraction_arithmetic_is_exact(verifier):
    # 25 / 8 is not an integer, yet (25 / 8 - 3) * 8 = 25 - 24 = 1 exactly; 7 / 3 * 3 = 7 (no float rounding)
    one = json.dumps({"numbers": [25, 8, 3, 8], "target": 1})
    assert verdict(verifier, "\\boxed{(25 / 8 - 3) * 8}", one).correct
    seven = json.dumps({"numbers": [7, 3, 3], "target": 7})
    assert verdict(verifier, "\\boxed{7 / 3 * 3}", seven).correct
    # 1 / 3 + 1 / 3 + 1 / 3 = 1 exactly (floats give 1.0 too, but 0.1-style sums would not: exactness by Fraction)
    ones = json.dumps({"numbers": [1, 3, 1, 3, 1, 3], "target": 1})
    assert verdict(verifier, "\\boxed{1/3 + 1/3 + 1/3}", ones).correct


@pytest.mark.parametrize("response, reason", [
    ("\\boxed{7 * 8 - 25}", "wrong_value"),                  # 31
    ("\\boxed{7 * 8 + 3}", "wrong_value"),                   # 59
    ("\\boxed{53}", "number_not_given"),                     # the target itself is not a given number
    ("\\boxed{7 * 7 + 8 - 3}", "number_reused"),             # 7 twice
    ("\\boxed{25 + 25 + 3}", "number_reused"),               # 53, but 25 twice
    ("\\boxed{50 + 3}", "number_not_given"),                 # 53 with a number not given
    ("\\boxed{25 / (8 - 8)}", "number_reused"),              # 8 twice: checked before the value
    ("\\boxed{(7 * 8 - 3) / (25 - 25)}", "number_reused"),
    ("\\boxed{-3 + 7 * 8}", "not_allowed"),                   # unary minus
    ("\\boxed{7 ** 2 + 3}", "not_allowed"),                   # power
    ("\\boxed{7 // 8 + 53}", "not_allowed"),                  # floor division
    ("\\boxed{__import__('os').system('true')}", "not_allowed"),
    ("\\boxed{(lambda: 53)()}", "not_allowed"),
    ("\\boxed{0x35}", "not_allowed"),                         # 53 in hex
    ("\\boxed{5_3}", "not_allowed"),
    ("\\boxed{7 * 8 - 3.0}", "not_allowed"),                  # a float literal
    ("\\boxed{7 * (8 - 3}", "malformed"),
    ("\\boxed{7 8 - 3}", "malformed"),
    ("\\boxed{7 * 8 - 3 = 50}", "malformed"),                 # an equation that does not state the target
    ("\\boxed{" + "(" * 150 + "3" + ")" * 150 + "}", "malformed"),  # over the length limit: never parsed
    ("The answer is 7 * 8 - 3.", "no_box"),                  # a sentence, not a final line of only the expression
    ("7 * 8 - 3 = 52", "no_box"),                             # unboxed: an equation not stating the target
    ("7 * 8 + 3 = 53", "wrong_value"),                        # unboxed final line stating the target: 59
    ("So:\n7 * 8 - 25", "wrong_value"),                       # unboxed final line, read as the answer: 31
    ("", "no_box"),
])
def test_wrong_answers_name_why(verifier, response, reason):
    result = verdict(verifier, response)
    assert not result.correct and result.score == 0.0 and not result.failed
    assert result.info["reason"] == reason, result.info


def test_division_by_zero_is_wrong_not_a_crash(verifier):
    zero = json.dumps({"numbers": [4, 2, 2, 9], "target": 9})
    result = verdict(verifier, "\\boxed{9 + 4 / (2 - 2)}", zero)
    assert not result.correct and result.info["reason"] == "division_by_zero"
    # the same numbers without the zero divisor: 9 + (2 - 2) * 4 = 9
    assert verdict(verifier, "\\boxed{9 + (2 - 2) * 4}", zero).correct


def test_numbers_given_twice_may_be_used_twice(verifier):
    twice = json.dumps({"numbers": [5, 5, 2], "target": 12})
    assert verdict(verifier, "\\boxed{5 + 5 + 2}", twice).correct
    assert verdict(verifier, "\\boxed{5 + 5 + 5 - 2 - 1}", twice).info["reason"] == "number_reused"


def test_injection_is_never_run(verifier, tmp_path):
    marker = tmp_path / "ran"
    response = f"\\boxed{{__import__('pathlib').Path({str(marker)!r}).touch() or 53}}"
    assert verdict(verifier, response).info["reason"] == "not_allowed"
    assert not marker.exists()


def test_a_broken_ground_truth_is_no_verdict(verifier):
    for truth in ("53", "{\"numbers\": [1, 2]}", json.dumps({"numbers": [1.5, 2], "target": 3}), None):
        result = verdict(verifier, "\\boxed{1 + 2}", truth)
        assert result.failed and "countdown ground truth" in result.info["reason"]
    assert verdict(verifier, "\\boxed{1 + 2}", {"numbers": [1, 2], "target": 3}).correct  # a dict is read too
