"""Sets of reals written as intervals or as inequalities (verifiers/math_sets.py), and truncated responses.

The pairs follow the peer suite's form (tests/unit/verifiers/test_peer_math_equiv.py): ``verify(prediction, gold)`` against a
label. Negatives differ by one thing each: an end point, an open end for a closed one, "and" for "or".
"""
from __future__ import annotations

import pytest
import sympy

from reasonrl.verifiers import get_verifier
from reasonrl.verifiers.math import _parse_answer
from reasonrl.verifiers.math_sets import same_sets, solution_set

UNION = "(-\\infty, 2) \\cup (3, \\infty)"
PAIRS = [  # (gold, prediction, expected_equal)
    # an interval and the inequality that describes it
    ("(1, 5)", "$1 < x < 5$", True),
    ("(1, 5)", "The solution set is $\\boxed{5 > x > 1}$.", True),
    ("(1, 5)", "\\boxed{x > 1 \\text{ and } x < 5}", True),
    ("[1, 5]", "\\boxed{1 \\le x \\le 5}", True),
    ("[-2, 7]", "\\boxed{-2 \\leq x \\leq 7}", True),
    ("[1, 5)", "\\boxed{1 \\le x < 5}", True),
    ("[3, \\infty)", "\\boxed{x \\geq 3}", True),
    ("(-\\infty, \\frac{1}{2})", "\\boxed{x < 0.5}", True),                      # 1/2 == 0.5
    ("(\\sqrt{2}, \\infty)", "\\boxed{x > \\sqrt{2}}", True),
    ("(-\\infty, 1) \\cup (1, \\infty)", "\\boxed{x \\neq 1}", True),
    ("0 \\le t \\le 4", "\\boxed{t \\in [0, 4]}", True),
    # unions
    (UNION, "\\boxed{x < 2 \\text{ or } x > 3}", True),
    (UNION, "\\boxed{x<2 \\quad\\text{or}\\quad x>3}", True),
    (UNION, "\\boxed{x < 2 \\lor x > 3}", True),
    ("(-\\infty, -1] \\cup [1, \\infty)", "\\boxed{x \\le -1 \\text{ or } x \\ge 1}", True),
    # the gold written as inequalities
    ("x < 2 \\text{ or } x > 3", "\\boxed{" + UNION + "}", True),
    ("-3 < x \\le 4", "\\boxed{(-3, 4]}", True),
    # negatives
    ("(1, 5)", "\\boxed{1 \\le x \\le 5}", False),                               # closed for open
    ("[1, 5]", "\\boxed{1 < x < 5}", False),                                     # open for closed
    ("[1, 5)", "\\boxed{1 < x \\le 5}", False),                                  # the two ends swapped
    ("(1, 5)", "\\boxed{1 < x < 6}", False),                                     # another end point
    ("(-\\infty, 2)", "\\boxed{x > 2}", False),
    ("[3, \\infty)", "\\boxed{x \\le 3}", False),
    (UNION, "\\boxed{x < 2 \\text{ or } x \\ge 3}", False),                      # one end closed
    (UNION, "\\boxed{2 < x < 3}", False),                                        # the complement
    (UNION, "\\boxed{x < 2 \\text{ and } x > 3}", False),                        # "and": the empty set
    (UNION, "\\boxed{x < 3 \\text{ or } x > 2}", False),                         # every real
    ("x < 2 \\text{ or } x > 3", "\\boxed{(-\\infty, 2] \\cup (3, \\infty)}", False),
    ("(-\\infty, 1) \\cup (1, \\infty)", "\\boxed{x \\neq 2}", False),
    ("(1, 5)", "\\boxed{1 < x < 5 \\text{ and } y > 0}", False),                 # two variables: not a set of reals
]


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("math")


@pytest.mark.parametrize("gold, prediction, expected_equal", PAIRS)
def test_intervals_and_inequalities(verifier, gold, prediction, expected_equal):
    result = verifier.verify(prediction, gold)
    assert result.correct is expected_equal, result.info


def test_solution_set_reads_both_forms_as_the_same_intervals():
    oo = sympy.oo
    # x <= -1 or 2 < x < 3 or x >= 7: three intervals, ends as written, sorted by their start
    expected = [(-oo, -1, True, False), (2, 3, True, True), (7, oo, False, True)]
    assert solution_set("x \\le -1 or 2 < x < 3 or x \\ge 7", _parse_answer) == expected
    assert solution_set("(-\\infty, -1] \\cup (2, 3) \\cup [7, \\infty)", _parse_answer) == expected
    # overlapping pieces merge: x < 3 or x > 2 is every real, one interval open at both infinite ends
    assert solution_set("x < 3 or x > 2", _parse_answer) == [(-oo, oo, True, True)]
    assert solution_set("x < 2 and x > 3", _parse_answer) == []
    # not a set of reals: an equation, two variables, a plain number
    for text in ("x = 2", "x + y < 1", "x < 1 or y > 2", "72"):
        assert solution_set(text, _parse_answer) is None, text
    assert same_sets([(1, sympy.Rational(1, 2), False, True)], [(1, sympy.Float(0.5), False, True)])
    assert not same_sets([(1, 2, False, True)], [(1, 2, True, True)])


@pytest.mark.parametrize("response", [
    "so the answer is \\boxed{72",                    # cut off before the closing brace
    "Thus \\boxed{\\frac{72}{1}",                     # cut off after a closed inner group
    "First \\boxed{72}. Checking again, the answer is \\boxed{7",  # an earlier closed box is not the answer
    "\\boxed{\\boxed{72}",                             # the outer box holds the closed inner one
])
def test_a_truncated_final_box_is_not_credited(verifier, response):
    result = verifier.verify(response, "72")
    assert result.score == 0.0 and not result.correct
    assert result.info["method"] == "unclosed_box" and "truncated" in result.info["reason"]


def test_closed_boxes_with_escaped_braces_still_count(verifier):
    assert verifier.verify("so \\boxed{\\{1, 2\\}}", "\\{1, 2\\}").correct
    assert verifier.verify("\\boxed{72}", "72").correct
