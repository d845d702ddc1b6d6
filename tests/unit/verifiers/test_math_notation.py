"""False negatives the math verifier no longer has: Unicode math symbols (verifiers/math_unicode.py), repeating
decimals (math_normalize.repeating_decimal) and a response that echoes an example's boxed answer before its own
(read by its own box; an unboxed answer after the echo is not read).

Pairs in the peer suite's form (tests/unit/verifiers/test_peer_math_equiv.py): ``verify(prediction, gold)`` against a label;
each negative differs from a positive by one thing.
"""
from __future__ import annotations

from fractions import Fraction

import pytest

from reasonrl.verifiers import get_verifier
from reasonrl.verifiers.math_normalize import repeating_decimal
from reasonrl.verifiers.math_unicode import unicode_to_latex

UNICODE_PAIRS = [  # (gold, prediction, expected_equal)
    ("\\sqrt{2}", "\\boxed{√2}", True),
    ("2\\sqrt{3}", "\\boxed{2√3}", True),
    ("\\sqrt{x+1}", "\\boxed{√(x+1)}", True),
    ("x^2+1", "\\boxed{x²+1}", True),
    ("9", "\\boxed{3²}", True),
    ("\\frac{1}{1000}", "\\boxed{10⁻³}", True),
    ("2\\pi", "\\boxed{2π}", True),
    ("\\frac{\\pi}{2}", "The answer is π/2.", True),
    ("12", "\\boxed{3×4}", True),
    ("3", "\\boxed{12÷4}", True),
    ("6", "\\boxed{2·3}", True),
    ("-5", "\\boxed{−5}", True),
    ("(-\\infty, 3]", "\\boxed{x ≤ 3}", True),
    ("(-\\infty, 3]", "\\boxed{(-∞, 3]}", True),
    ("\\infty", "\\boxed{∞}", True),
    ("\\frac{1}{2}", "\\boxed{½}", True),
    ("\\frac{5}{2}", "\\boxed{2½}", True),
    ("72", "\\boxed{７２}", True),                           # full-width digits
    # negatives
    ("\\sqrt{3}", "\\boxed{√2}", False),
    ("x^3+1", "\\boxed{x²+1}", False),
    ("5", "\\boxed{−5}", False),
    ("(-\\infty, 3)", "\\boxed{x ≤ 3}", False),               # closed end for an open one
    ("\\frac{1}{3}", "\\boxed{½}", False),
    ("\\pi", "\\boxed{2π}", False),
]

REPEATING_PAIRS = [
    ("\\frac{1}{3}", "\\boxed{0.\\overline{3}}", True),
    ("\\frac{1}{6}", "\\boxed{0.1\\overline{6}}", True),
    ("\\frac{1}{7}", "\\boxed{0.\\overline{142857}}", True),
    ("\\frac{4}{3}", "\\boxed{1.\\overline{3}}", True),
    ("0.\\overline{3}", "\\boxed{\\frac{1}{3}}", True),         # the gold written as a repeating decimal
    ("\\frac{1}{3}", "\\boxed{0.\\bar{3}}", True),
    ("0.3", "\\boxed{0.\\overline{3}}", False),                 # 0.333... is not 0.3
    ("\\frac{1}{6}", "\\boxed{0.\\overline{16}}", False),       # 16/99
    ("\\frac{1}{3}", "\\boxed{0.33}", False),
]

ECHO_PAIRS = [  # a response echoing the prompt's worked example (its boxed answer 5) before its own answer 7
    ("7", "Example answer \\boxed{5}\n\\boxed{7}", True),
    ("7", "Example: $\\boxed{5}$\n$x = \\boxed{7}$", True),
    # an unboxed answer after an echoed box is not read: it cannot be told from a hedge ("\\boxed{5}, no wait: 7")
    ("7", "In the example the result was \\boxed{5}.\n#### 7", False),
    ("7", "Example: 2+3=\\boxed{5}\nProblem: 3+4=?\nSolution: 3+4=7\nThe answer is 7", False),
    ("5", "Example answer \\boxed{5}\n\\boxed{7}", False),
    ("7", "\\boxed{7}. Let me double check: the answer is consistent with the example.", True),  # a remark, not an answer
    ("1, 2", "$\\boxed{1}$ and $\\boxed{2}$", True),            # one list on one line still joins
]


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("math")


@pytest.mark.parametrize("gold, prediction, expected_equal", UNICODE_PAIRS + REPEATING_PAIRS + ECHO_PAIRS)
def test_notation_pairs(verifier, gold, prediction, expected_equal):
    result = verifier.verify(prediction, gold)
    assert result.correct is expected_equal, result.info


def test_unicode_to_latex_rewrites_symbols():
    assert unicode_to_latex("2πr") == "2\\pi r"           # a space keeps \pi apart from the next letter
    assert unicode_to_latex("√(x+1) − 10⁻³") == "\\sqrt{x+1} - 10^{-3}"
    assert unicode_to_latex("a₁ ≠ ∛8") == "a_{1} \\ne \\sqrt[3]{8}"
    assert unicode_to_latex("⅜") == "\\frac{3}{8}"        # any vulgar fraction, from its Unicode decomposition
    assert unicode_to_latex("plain ascii 1/2") == "plain ascii 1/2"


def test_repeating_decimal_values():
    # 0.1(6): (16 - 1) / (10 * 9) = 15/90 = 1/6; 1.2(34): 1 + (234 - 2) / (10 * 99) = 1 + 232/990 = 611/495
    assert repeating_decimal("0.1\\overline{6}") == Fraction(1, 6)
    assert repeating_decimal("1.2\\overline{34}") == Fraction(611, 495)
    assert repeating_decimal("-0.\\overline{9}") == -1
    assert repeating_decimal("0.33") is None and repeating_decimal("\\overline{3}") is None
